"""Normal and truncated-normal draws inside steps, as Keras code makes them: a variational
autoencoder whose sampling layer draws its noise with keras.random.normal (the
reparameterisation), a layer that adds keras.random.truncated_normal noise while training, and
a tf.function returning tf.random.stateless_normal / stateless_truncated_normal draws of sizes
that are not a multiple of four. Nothing SALUS-specific: TensorFlow's graphs carry
StatelessRandomNormalV2 and StatelessTruncatedNormalV2.

Prints one JSON line: per-epoch losses, the trained weights and the raw draws. SALUS_TF_DISABLE=1
gives the CPU reference.
"""

import json

import keras
import numpy as np
import tensorflow as tf


class Sampling(keras.layers.Layer):
    """z = mean + exp(log_var / 2) * noise, and the KL term as an added loss."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.seed_generator = keras.random.SeedGenerator(11)

    def call(self, inputs):
        mean, log_var = inputs
        noise = keras.random.normal(tf.shape(mean), seed=self.seed_generator)
        kl = -0.5 * tf.reduce_mean(1 + log_var - tf.square(mean) - tf.exp(log_var))
        self.add_loss(0.1 * kl)
        return mean + tf.exp(0.5 * log_var) * noise


class TruncatedNoise(keras.layers.Layer):
    def __init__(self, scale: float, **kw) -> None:
        super().__init__(**kw)
        self.scale = scale
        self.seed_generator = keras.random.SeedGenerator(5)

    def call(self, x, training=None):
        if not training:
            return x
        return x + self.scale * keras.random.truncated_normal(tf.shape(x),
                                                              seed=self.seed_generator)


keras.utils.set_random_seed(4)
rng = np.random.default_rng(4)
x = rng.standard_normal((64, 12)).astype("float32")

inputs = keras.Input((12,))
h = TruncatedNoise(0.1)(inputs)
h = keras.layers.Dense(16, activation="relu")(h)
mean = keras.layers.Dense(3)(h)
log_var = keras.layers.Dense(3)(h)
z = Sampling()([mean, log_var])
out = keras.layers.Dense(12)(keras.layers.Dense(16, activation="relu")(z))
model = keras.Model(inputs, out)
model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
history = model.fit(x, x, batch_size=16, epochs=3, shuffle=False, verbose=0)


@tf.function
def draws(seed):
    return (tf.random.stateless_normal([3, 7, 11], seed=seed),
            tf.random.stateless_truncated_normal([1001], seed=seed, mean=1.0, stddev=2.0))


normal, truncated = draws(tf.constant([17, 23], tf.int64))
print(json.dumps({
    "loss": history.history["loss"],
    "weights": [np.asarray(w).ravel().tolist() for w in model.get_weights()],
    "normal": np.asarray(normal).ravel().tolist(),
    "truncated": np.asarray(truncated).ravel().tolist(),
    "devices": [d.device_type for d in tf.config.list_logical_devices()],
}))

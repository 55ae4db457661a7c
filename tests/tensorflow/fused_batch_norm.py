"""A Keras model whose normalisation is TensorFlow's own fused kernel (FusedBatchNormV3 and its
gradient, as tf.keras 2's BatchNormalization emitted them): a small layer calling
tf.compat.v1.nn.fused_batch_norm in training (batch statistics, running averages updated with
exponential_avg_factor) and in inference, trained with SGD, nothing SALUS-specific.

Prints one JSON line: per-epoch losses, the evaluation and the trained weights (the running
moments among them). SALUS_TF_DISABLE=1 gives the CPU reference.
"""

import json

import keras
import numpy as np
import tensorflow as tf


class FusedBatchNorm(keras.layers.Layer):
    def build(self, shape):
        c = shape[-1]
        self.gamma = self.add_weight(shape=(c,), initializer="ones", name="gamma")
        self.beta = self.add_weight(shape=(c,), initializer="zeros", name="beta")
        self.mean = self.add_weight(shape=(c,), initializer="zeros", trainable=False, name="mean")
        self.var = self.add_weight(shape=(c,), initializer="ones", trainable=False, name="var")

    def call(self, x, training=False):
        if training:
            y, mean, var = tf.compat.v1.nn.fused_batch_norm(
                x, self.gamma, self.beta, self.mean, self.var, epsilon=1e-3,
                is_training=True, exponential_avg_factor=0.1)
            self.mean.assign(mean)
            self.var.assign(var)
            return y
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(x, self.gamma, self.beta, self.mean, self.var,
                                                   epsilon=1e-3, is_training=False)
        return y


keras.utils.set_random_seed(5)
rng = np.random.default_rng(5)
x = (rng.standard_normal((96, 10, 10, 3)) * 2 + 1).astype("float32")
y = (x[:, :5, :5, 0].mean(axis=(1, 2)) > 1).astype("int64")
model = keras.Sequential([
    keras.Input((10, 10, 3)),
    keras.layers.Conv2D(6, 3),
    FusedBatchNorm(),
    keras.layers.ReLU(),
    keras.layers.Flatten(),
    keras.layers.Dense(2),
])
model.compile(optimizer=keras.optimizers.SGD(0.05),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(x, y, batch_size=32, epochs=3, shuffle=False, verbose=0)
evaluation = model.evaluate(x, y, batch_size=32, verbose=0)
print(json.dumps({
    "loss": history.history["loss"],
    "evaluate": float(evaluation),
    "weights": [np.asarray(w).ravel().tolist() for w in model.get_weights()],
}))

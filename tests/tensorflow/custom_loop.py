"""A plain custom training loop: tf.function + GradientTape + Adam on a regression MLP, then
a last epoch through a step that returns nothing, then model.save and keras.models.load_model.
Nothing SALUS-specific.

Prints one JSON line: the per-step losses, the trained weights, and the predictions of the
saved-and-reloaded model. `argv[1]` is a directory for the saved model.
"""

import json
import os
import sys

import keras
import numpy as np
import tensorflow as tf

keras.utils.set_random_seed(3)
rng = np.random.default_rng(2)
x = rng.standard_normal((256, 8)).astype("float32")
y = (x @ rng.standard_normal((8, 1)) + 0.1 * np.sin(3 * x[:, :1])).astype("float32")

model = keras.Sequential([
    keras.Input((8,)),
    keras.layers.Dense(32, activation="tanh"),
    keras.layers.Dense(16, activation="sigmoid"),
    keras.layers.Dense(1),
])
optimizer = keras.optimizers.Adam(learning_rate=0.01)
mse = keras.losses.MeanSquaredError()


def step(xb, yb):
    with tf.GradientTape() as tape:
        loss = mse(yb, model(xb, training=True))
    grads = tape.gradient(loss, model.trainable_variables)
    optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=False))
    return loss


train_step = tf.function(step)


@tf.function
def update_only(xb, yb):
    step(xb, yb)


losses = []
for _epoch in range(3):
    for i in range(0, 256, 64):
        losses.append(float(train_step(x[i:i + 64], y[i:i + 64])))
for i in range(0, 256, 64):
    update_only(x[i:i + 64], y[i:i + 64])

path = os.path.join(sys.argv[1], "model.keras")
model.save(path)
reloaded = keras.models.load_model(path)
print(json.dumps({
    "loss": losses,
    "weights": [np.asarray(w).ravel().tolist() for w in model.get_weights()],
    "reloaded_predictions": np.asarray(reloaded.predict(x[:16], verbose=0)).ravel().tolist(),
    "predictions": np.asarray(model(x[:16])).ravel().tolist(),
}))

"""A plain Keras script: nothing in it names SALUS. With the salus-tensorflow plugin installed
(scripts/build installs it into .venv-tf), TensorFlow lists the SALUS device and places the
model's train, evaluate and predict steps there, each one daemon session.

    .venv-tf/bin/python examples/keras_fit.py [--epochs 3]

SALUS_TF_DISABLE=1 runs the same script on TensorFlow's CPU device, to compare.
"""

import argparse

import keras
import numpy as np
import tensorflow as tf

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--samples", type=int, default=512)
args = p.parse_args()

print("devices:", [d.device_type for d in tf.config.list_logical_devices()])
keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
# Which quadrant of a 16x16 image is brightest.
x = rng.uniform(0, 1, (args.samples, 16, 16, 1)).astype("float32")
y = rng.integers(0, 4, args.samples)
for i, q in enumerate(y):
    r, c = divmod(int(q), 2)
    x[i, r * 8:(r + 1) * 8, c * 8:(c + 1) * 8] += 1.0

model = keras.Sequential([
    keras.Input((16, 16, 1)),
    keras.layers.Conv2D(16, 3, activation="relu"),
    keras.layers.MaxPooling2D(),
    keras.layers.Conv2D(32, 3, activation="relu"),
    keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(4, activation="softmax"),
])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x, y, batch_size=32, epochs=args.epochs, verbose=2)
loss, accuracy = model.evaluate(x, y, verbose=0)
print(f"evaluate: loss {loss:.4f} accuracy {accuracy:.3f}")
print("predicted quadrants of the first 8:", model.predict(x[:8], verbose=0).argmax(axis=1),
      "true:", y[:8])

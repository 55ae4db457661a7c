"""A Keras CNN with grouped convolutions (Conv2D(groups=...), as ConvNeXt's depthwise layers and
ResNeXt-style blocks write them), trained with SGD, nothing SALUS-specific. On TensorFlow's CPU
Keras runs them as XLA functions; on SALUS the adaptor's import hook leaves them plain Conv2D
ops (and their grouped gradients), which the daemon runs.

Prints one JSON line: per-epoch losses and the trained weights. SALUS_TF_DISABLE=1 gives the CPU
reference.
"""

import json

import keras
import numpy as np

keras.utils.set_random_seed(3)
rng = np.random.default_rng(3)
x = rng.standard_normal((64, 9, 9, 8)).astype("float32")
y = (x[:, :4, :4, :2].mean(axis=(1, 2, 3)) > 0).astype("int64")
model = keras.Sequential([
    keras.Input((9, 9, 8)),
    keras.layers.Conv2D(8, 3, groups=4, activation="relu"),
    keras.layers.Conv2D(8, 3, padding="same", groups=8),
    keras.layers.Flatten(),
    keras.layers.Dense(2),
])
model.compile(optimizer=keras.optimizers.SGD(0.05),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
print(json.dumps({
    "loss": history.history["loss"],
    "weights": [np.asarray(w).ravel().tolist() for w in model.get_weights()],
}))

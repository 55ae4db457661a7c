"""A Keras CNN that pads with reflected and symmetric borders (tf.pad's REFLECT and SYMMETRIC
modes, as style-transfer and image-to-image networks pad), trained with Adam, nothing
SALUS-specific: TensorFlow's graph carries MirrorPad and its gradient, MirrorPadGrad.

Prints one JSON line: per-epoch losses and the trained weights. SALUS_TF_DISABLE=1 gives the CPU
reference.
"""

import json

import keras
import numpy as np
import tensorflow as tf


class MirrorPadding2D(keras.layers.Layer):
    def __init__(self, pad: int, mode: str, **kw) -> None:
        super().__init__(**kw)
        self.pad, self.mode = pad, mode

    def call(self, x):
        p = self.pad
        return tf.pad(x, [[0, 0], [p, p], [p, p], [0, 0]], mode=self.mode)


keras.utils.set_random_seed(7)
rng = np.random.default_rng(7)
x = rng.standard_normal((48, 10, 10, 3)).astype("float32")
y = (x[:, :5, :, 0].mean(axis=(1, 2)) > 0).astype("int64")
model = keras.Sequential([
    keras.Input((10, 10, 3)),
    MirrorPadding2D(2, "REFLECT"),
    keras.layers.Conv2D(8, 5, activation="relu"),
    MirrorPadding2D(1, "SYMMETRIC"),
    keras.layers.Conv2D(8, 3, activation="relu"),
    keras.layers.GlobalAveragePooling2D(),
    keras.layers.Dense(2),
])
model.compile(optimizer=keras.optimizers.Adam(0.01),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
history = model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0)
print(json.dumps({
    "loss": history.history["loss"],
    "weights": [np.asarray(w).ravel().tolist() for w in model.get_weights()],
}))

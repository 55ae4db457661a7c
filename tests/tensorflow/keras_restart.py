"""A plain Keras fit through which the daemon may restart: with $RESTART_AT_BATCH set, after
that batch it prints "restart" and waits until the file $RESTART_FLAG exists (the test drains
the daemon with a snapshot and starts a new one meanwhile), then fit goes on untouched.

Prints one JSON line: per-epoch losses and the trained weights.
"""

import json
import os
import sys
import time

import keras
import numpy as np

keras.utils.set_random_seed(7)
rng = np.random.default_rng(0)
x = rng.standard_normal((256, 20)).astype("float32")
y = (x[:, :10].argmax(axis=1)).astype("int64")


class Restart(keras.callbacks.Callback):
    def __init__(self, at: int, flag: str) -> None:
        super().__init__()
        self.at, self.flag, self.seen = at, flag, 0

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        self.seen += 1
        if self.seen != self.at:
            return
        print("restart", flush=True)
        while not os.path.exists(self.flag):
            time.sleep(0.05)


model = keras.Sequential([
    keras.Input((20,)),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(10, activation="softmax"),
])
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
callbacks = []
if os.environ.get("RESTART_AT_BATCH"):
    callbacks.append(Restart(int(os.environ["RESTART_AT_BATCH"]), os.environ["RESTART_FLAG"]))
history = model.fit(x, y, batch_size=32, epochs=2, shuffle=False, verbose=0, callbacks=callbacks)
print(json.dumps({
    "loss": history.history["loss"],
    "weights": [np.asarray(w).ravel().tolist() for w in model.get_weights()],
}))
sys.stdout.flush()

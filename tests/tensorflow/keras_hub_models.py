"""keras_hub backbones as a user builds them from a small config with random weights (BERT,
GPT-2, T5), each under a classification head, fitted with Adam for two epochs (the last batch
short), evaluated and predicted; nothing SALUS-specific. BERT's feed-forward layers use GELU.

    keras_hub_models.py MODEL      MODEL: bert, gpt2 or t5

Prints one JSON line: per-epoch losses, the evaluated loss, the predictions and the trained
weights (SALUS_TF_DISABLE=1 gives the CPU reference).
"""

import json
import sys

import keras
import keras_hub
import numpy as np
import tensorflow as tf

SMALL = dict(vocabulary_size=100, num_layers=2, num_heads=2, hidden_dim=32, intermediate_dim=64)

keras.utils.set_random_seed(0)
rng = np.random.default_rng(0)
tokens = rng.integers(0, 100, (20, 16)).astype("int32")
mask = np.ones_like(tokens)
mask[:, 12:] = 0  # padded tail, so the attention masks matter
labels = rng.integers(0, 3, (20,))

name = sys.argv[1]
if name == "bert":
    backbone = keras_hub.models.BertBackbone(**SMALL, max_sequence_length=16)
    inputs = {"token_ids": tokens, "segment_ids": np.zeros_like(tokens), "padding_mask": mask}
    features = backbone(backbone.input)["pooled_output"]
elif name == "gpt2":
    backbone = keras_hub.models.GPT2Backbone(**SMALL, max_sequence_length=16)
    inputs = {"token_ids": tokens, "padding_mask": mask}
    features = keras.layers.GlobalAveragePooling1D()(backbone(backbone.input))
elif name == "t5":
    backbone = keras_hub.models.T5Backbone(**SMALL, key_value_dim=16)
    inputs = {"encoder_token_ids": tokens, "encoder_padding_mask": mask,
              "decoder_token_ids": tokens[:, ::-1].copy(), "decoder_padding_mask": mask}
    features = keras.layers.GlobalAveragePooling1D()(
        backbone(backbone.input)["decoder_sequence_output"])
else:
    raise SystemExit(f"unknown model {name!r}: bert, gpt2 or t5")

model = keras.Model(backbone.input, keras.layers.Dense(3, activation="softmax")(features))
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
history = model.fit(inputs, labels, batch_size=8, epochs=2, shuffle=False, verbose=0)
print(json.dumps({
    "loss": history.history["loss"],
    "evaluate": model.evaluate(inputs, labels, batch_size=8, verbose=0),
    "predict": model.predict(inputs, batch_size=8, verbose=0).tolist(),
    "weights": [np.asarray(w).ravel().tolist() for w in model.get_weights()],
    "devices": [d.device_type for d in tf.config.list_logical_devices()],
}))

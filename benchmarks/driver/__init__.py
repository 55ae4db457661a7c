"""The benchmark driver: the Salus paper's experiments, run on this machine and reported.

    .venv/bin/python -m benchmarks.driver <experiment> [--out DIR] [--endpoint EP] [--smoke]

Experiments: trace (Table 1, Figure 7), fairness (Figure 9), srtf (Figure 8), hyperparam
(Figure 11), inference (Figure 10), overhead (Figure 12), and interactive (an inference
service beside batch training, by latency class). Each starts its own salus-server
(or uses --endpoint), writes CSV, PNG plots and report.md into --out (default
results/<experiment>-<timestamp>/) and shows a progress bar. --smoke runs the smallest scale.
"""

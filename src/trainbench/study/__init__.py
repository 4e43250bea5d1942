"""A study's definition: the parameters a cell can set (`params`), the config schema (`schema`),
timing settings (`timing`), the expansion of a study into typed cells (`grid`, `cell`), the
loading of config.yaml (`config`), and a cell's parameters in words (`words`).

May import: `registry`, and `trainbench.errors` / `trainbench.paths`. Loading a config imports no
prediction, training or reporting code.
"""

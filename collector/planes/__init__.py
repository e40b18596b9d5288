"""The controller's evidence sources, one module per plane (collector/planes/base.py says what a
source is; collector/planes/registry.py builds the ones the settings enable)."""

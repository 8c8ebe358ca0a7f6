"""What a checkpoint should hold, from its config.json: config, expected layout, accounting, cards.

config.py reads config.json into ModelConfig; layout.py derives every expected tensor the way
modeling_deepseek.py builds the model; accounting.py and explain.py count and describe parameters;
checkpoint.py loads what an audit reads (config, index, headers). It imports sources/ and format/, never a
later stage.
"""

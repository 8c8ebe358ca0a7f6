"""What a checkpoint should hold, from its config.json: config, expected layout, accounting, cards.

config.py reads config.json into ModelConfig (its `quant` plan, quant.py, the only description of the
quantization); arch/ describes each architecture's module tree once, registered by model_type; layout.py,
accounting/ and explain.py are walks over that description (every expected tensor; the parameter tree;
cards); kinds.py tells a tensor's kind from its name; checkpoint.py loads what an audit reads (config,
index, headers). It imports sources/, format/ and numerics/ (numpy only inside functions), never a later
stage.
"""

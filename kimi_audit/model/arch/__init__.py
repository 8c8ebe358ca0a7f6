"""Architectures as data: one module per architecture describes its module tree once (spec.py's types), and
registry.py maps each config `model_type` to it. The expected layout (model.layout), the parameter accounting
tree (model.accounting.model) and so explain's cards are walks over that one description.
"""

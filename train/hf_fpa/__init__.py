"""The PyTorch side of the fpa-torch export format (train/tools/export.py copies these files as is).

    configuration_fpa.py   FPAConfig (transformers PretrainedConfig, model_type fpa_transformer)
    modeling_fpa.py        FPAForCausalLM: the FPA language model in dense PyTorch

Both import only torch and transformers, so that an export loads with
`AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` without this project;
nothing in this project imports them.
"""

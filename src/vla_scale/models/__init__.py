"""Policy families and what they share.

One folder per family (`oft/`: OpenVLA-OFT; `pi0/`: π0 and π0.5), each reached through `interface.PolicySource`;
beside them what every family uses: the interface, the registry of families and how a checkpoint folder's family is
told (`families.py`), LoRA, the critic's value head, the FP8 products, kernels, tokenizers and the model hub's folders.
"""

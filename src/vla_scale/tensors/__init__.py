"""Tensors read exactly as they lie: fingerprints of their bits and tensors end to end in one storage, what the weight
sync and the rollout engine both use (torch only, nothing else of the project)."""

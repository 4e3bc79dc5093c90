"""Supervised fine-tuning of the policy on demonstrations: their statistics, the examples the policy trains on, and
the run (SupervisedTrainer, launch/sft.py)."""

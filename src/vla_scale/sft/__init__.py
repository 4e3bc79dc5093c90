"""Supervised fine-tuning of the policy on demonstrations: their statistics and the examples the policy trains on."""

"""Moving exact weights: the actor's ZeRO-3 shards gathered into rollout engines (in-process or over an update
group), checked bit for bit and fingerprinted; the engine itself knows no transport."""

"""OpenVLA-OFT as a family beside `models/pi0/`: its policy (a Llama backbone reading a whole action chunk per forward,
action bins or the L1 head), how the rollout engine decodes it (`decode.OFTDecoder`, with the engine's fast forward)
and how the actor scores its tokens again (`decode.OFTScorer`)."""

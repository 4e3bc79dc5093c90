"""openpi's own `PI0Pytorch.sample_actions`, timed on a case `benchmarks/pi0_scale.py` wrote (its weights, inputs and
noise), in a process of its own: nothing from vla_scale is imported here, and openpi is never imported by vla_scale.

    PYTHONPATH=<openpi env>:<openpi>/src python benchmarks/openpi_sample_actions.py --case DIR --out result.json

The process needs openpi's source at the commit of tests/fixtures/openpi_reference/COMMIT and the transformers
4.53.2 its PyTorch model is written for, with openpi's `models_pytorch/transformers_replace` files copied over it
(openpi's README step); `benchmarks/pi0_scale.py --openpi DIR` builds that environment from DIR/src/openpi and the
wheels in DIR/wheels (transformers 4.53.2, tokenizers 0.21, huggingface_hub 0.36, beartype 0.19, jaxtyping 0.2.36
and typeguard 2.13.3: the versions transformers and openpi's imports ask for; jax and flax come from the machine) and
runs this script in it.

The case folder holds `case.json` (the shape: `paligemma_variant`, `action_expert_variant`, `pi05`, `action_dim`,
`action_horizon`, `num_steps`, `repeats`, `warmup`, `compile`), `weights.safetensors` (the policy's parameters under
openpi's PI0Pytorch names) and `inputs.safetensors` (`images` float [B, N, 3, S, S] in [-1, 1], `image_masks` bool
[B, N], `tokens`, `token_masks`, `state`, `noise`). The model is built with openpi's bfloat16 precision (its selected
parameters kept in float32), eager (`pytorch_compile_mode=None`) or, with `compile`, as openpi's default config
compiles it (`max-autotune`). Writes the seconds of each timed call and the actions of the first.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from safetensors.torch import load_file, save_file

CAMERAS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
"""openpi's image keys, in its slot order."""


def model(case: dict, weights: dict[str, torch.Tensor], device: torch.device) -> torch.nn.Module:
    from openpi.models_pytorch.pi0_pytorch import PI0Pytorch

    config = SimpleNamespace(pi05=case["pi05"], paligemma_variant=case["paligemma_variant"],
                             action_expert_variant=case["action_expert_variant"], dtype="bfloat16",
                             action_dim=case["action_dim"], action_horizon=case["action_horizon"],
                             pytorch_compile_mode="max-autotune" if case["compile"] else None)
    policy = PI0Pytorch(config)
    missing, unexpected = policy.load_state_dict(weights, strict=False)
    missing = [k for k in missing if "lm_head" not in k]  # openpi's checkpoints leave the tied LM head out too
    if missing or unexpected:
        raise SystemExit(f"the weights do not fit openpi's model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    policy.paligemma_with_expert.to_bfloat16_for_selected_params("bfloat16")
    return policy.to(device).eval()


def observation(inputs: dict[str, torch.Tensor], device: torch.device) -> SimpleNamespace:
    """The fields `preprocess_observation_pytorch` reads, images channels-first in [-1, 1] at the tower's side."""
    images, masks = inputs["images"].to(device), inputs["image_masks"].to(device)
    return SimpleNamespace(images={k: images[:, i] for i, k in enumerate(CAMERAS[: images.shape[1]])},
                           image_masks={k: masks[:, i] for i, k in enumerate(CAMERAS[: images.shape[1]])},
                           state=inputs["state"].to(device), tokenized_prompt=inputs["tokens"].to(device),
                           tokenized_prompt_mask=inputs["token_masks"].to(device), token_ar_mask=None,
                           token_loss_mask=None)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", required=True, help="the folder pi0_scale.py wrote")
    p.add_argument("--out", required=True, help="the result's JSON file (the actions beside it, .safetensors)")
    args = p.parse_args()
    case_dir = Path(args.case)
    case = json.loads((case_dir / "case.json").read_text())
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    start = time.perf_counter()
    policy = model(case, load_file(str(case_dir / "weights.safetensors")), device)
    build_s = time.perf_counter() - start
    inputs = load_file(str(case_dir / "inputs.safetensors"))
    obs, noise = observation(inputs, device), inputs["noise"].to(device)
    seconds, actions = [], None
    with torch.no_grad():
        for index in range(case["warmup"] + case["repeats"]):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            out = policy.sample_actions(device, obs, noise=noise.clone(), num_steps=case["num_steps"])
            if device.type == "cuda":
                torch.cuda.synchronize()
            if index >= case["warmup"]:
                seconds.append(time.perf_counter() - start)
            if actions is None:
                actions = out.float().cpu()
    assert actions is not None
    save_file({"actions": actions.contiguous()}, str(Path(args.out).with_suffix(".safetensors")))
    import transformers

    Path(args.out).write_text(json.dumps({"seconds": seconds, "build_s": build_s, "compile": case["compile"],
                                          "transformers": transformers.__version__, "torch": torch.__version__,
                                          "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"}))


if __name__ == "__main__":
    main()

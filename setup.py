from setuptools import find_packages, setup

setup(
    name="vla_scale",
    version="0.1.0",
    description="Reinforcement learning for Vision-Language-Action policies in simulation (GRPO, DeepSpeed, Ray).",
    package_dir={"": "src"},
    packages=find_packages("src"),
    python_requires=">=3.11",
    install_requires=[
        "torch==2.13.0",
        "transformers==5.24.0",
        "tokenizers==0.23.3",
        "safetensors==0.8.0",
        "sentencepiece==0.2.3",
        "deepspeed==0.19.8",
        "ray==2.60.0",
        "hydra-core==1.3.8",
        "omegaconf==2.3.1",
        "tensorboard==2.21.0",
        "mujoco==3.3.2",
        "numpy==2.4.6",
        "tqdm==4.70.1",
        "ninja==1.13.2",
        "imageio==2.38.1",
        "pillow==13.0.0",
        "simplejpeg==1.9.0",
        "pyarrow==26.0.1",
        "av==18.1.0",
    ],
    extras_require={
        # mmaemu: the H100's FP8 tensor-core products emulated bit for bit on the CPU, what the FP8 tests check
        # the arithmetic of the GPU path against (tests/models/test_fp8_h100_products.py).
        "dev": ["pytest==9.2.0", "pytest-timeout==2.4.0", "pytest-xdist==3.8.0", "ruff==0.17.6", "mmaemu==0.1.0"],
        # What LIBERO, robosuite and bddl import at run time. Those three themselves (and the scene assets) install
        # with --no-deps: their declared dependencies pull torchvision, wandb, robomimic... (`make libero`).
        "libero": [
            "numba==0.68.1",
            "scipy==1.17.1",
            "networkx==3.6.1",
            "easydict==1.14",
            "matplotlib==3.11.2",
            "cloudpickle==3.1.3",
            "opencv-python-headless==5.0.0.93",
            "gymnasium==1.4.0",
            "future==1.0.0",
            "termcolor==3.3.0",
            "PyYAML==6.0.4",
            "imageio-ffmpeg==0.8.1",
        ],
        # What Meta-World imports at run time; metaworld itself installs with --no-deps (it pins mujoco==3.3.0 and
        # runs under the pinned one: `make metaworld`).
        "metaworld": ["gymnasium==1.4.0", "scipy==1.17.1", "imageio==2.38.1"],
        # Liger Kernel's Triton kernels for the policies' norms, gated MLPs and rotary embeddings on a CUDA GPU
        # (model.kernels=liger); a CPU install runs the eager layers and needs none of it.
        "kernels": ["liger-kernel==0.8.5"],
    },
)

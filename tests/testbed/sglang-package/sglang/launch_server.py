"""The testbed's stand-in for `python3 -m sglang.launch_server`: the vLLM stand-in's ranks (one
implementation of the process group, the API and the weights' checks) with SGLang's flags and log
lines (its `sglang_main`, which names the SGLang release it prints)."""

import importlib.machinery
import importlib.util
import os
import sys


def standin():
    here = os.path.dirname(os.path.abspath(__file__))
    # In the image: the stand-in installed as `vllm`; in a checkout: the file beside this package.
    for path in ("/usr/local/bin/vllm", os.path.join(here, "..", "..", "vllm-standin.py")):
        if os.path.isfile(path):
            loader = importlib.machinery.SourceFileLoader("sparkform_engine_standin", path)
            spec = importlib.util.spec_from_loader(loader.name, loader)
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
            return module
    sys.exit("the engine stand-in (vllm-standin.py) is not installed")


if __name__ == "__main__":
    standin().sglang_main(sys.argv[1:])

"""The testbed's stand-in `sglang` package: only `python3 -m sglang.launch_server`."""

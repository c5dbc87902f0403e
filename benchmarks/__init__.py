"""The benchmarks and drills behind `make bench*`, `make fault-drill` and `make gpu-check`, beside
the outputs they recorded (the .txt files here; README.md says which command wrote which). Run
each as a module from the repository's root: `python -m benchmarks.bench_train --help`."""

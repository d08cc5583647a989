import sys

from gpustack_dspark.devstack.demo import main

if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["demo"]:
        args = args[1:]
    sys.exit(main(args))

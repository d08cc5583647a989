"""python -m gpustack_dspark.devstack [demo ARGS | image]

demo  (default) the whole container path until Ctrl-C (`make demo`)
image build (or find, by the hash of its inputs) the CPU DSpark image; prints its name
"""

import sys
import time

from gpustack_dspark.devstack.demo import main


def image_main() -> int:
    from gpustack_dspark.devstack import podman as podman_host
    from gpustack_dspark.devstack.container_stack import build_cpu_image

    try:
        config = podman_host.prepare()
        log = config.root / "image-build.log"
        started = time.monotonic()
        image = build_cpu_image(config, log)
    except Exception as e:
        print(f"image: {e}", file=sys.stderr)
        return 1
    print(f"{image}  ({time.monotonic() - started:.1f}s; log {log})", file=sys.stderr)
    print(image)
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["image"]:
        sys.exit(image_main())
    if args[:1] == ["demo"]:
        args = args[1:]
    sys.exit(main(args))

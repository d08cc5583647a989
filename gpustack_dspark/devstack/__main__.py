"""python -m gpustack_dspark.devstack [demo ARGS | image]

demo  (default) the whole container path until Ctrl-C (`make demo`)
image build (or find, by the hash of its inputs) the CPU DSpark image; prints its name on
      stdout, and on stderr each build step as it starts, with the time since the start, a
      line at least every 10 s while a step works, and the build log's path
"""

import sys
import time

from gpustack_dspark.devstack.demo import main


def image_main() -> int:
    from gpustack_dspark.devstack import podman as podman_host
    from gpustack_dspark.devstack.container_stack import build_cpu_image
    from gpustack_dspark.devstack.progress import Progress

    out = Progress(sys.stderr, t0=time.time())
    try:
        config = podman_host.prepare()
        log = config.root / "image-build.log"
        out.say(f"[image] finding or building the CPU DSpark image (log {log})")
        step = {"line": "checking the image's inputs", "t": time.monotonic()}

        def on_line(line: str) -> None:
            step.update(line=line, t=time.monotonic())
            out.say(f"[image] {line}")

        out.phase("image", lambda: f"{step['line'][:70]} ({time.monotonic() - step['t']:.0f}s; log {log})")
        out.start_heartbeat("[image]")
        started = time.monotonic()
        image = build_cpu_image(config, log, on_line=on_line)
    except Exception as e:
        out.say(f"image: {e}")
        out.close()
        return 1
    out.phase(None)
    out.say(f"[image] {image}  ({time.monotonic() - started:.1f}s; log {log})")
    out.close()
    print(image)
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["image"]:
        sys.exit(image_main())
    if args[:1] == ["demo"]:
        args = args[1:]
    sys.exit(main(args))

"""python -m gpustack_dspark.devstack [demo ARGS | image [--base]]

demo  (default) the whole container path until Ctrl-C (`make demo`)
image build (or find, by the hash of its inputs) the CPU DSpark image; prints its name on
      stdout, and on stderr each build step as it starts, with the time since the start, a
      line at least every 10 s while a step works, and the build log's path. --base: only
      its Debian and runtime bases (once per machine), which need no venv: `make demo` runs
      this with the system Python while the venvs install (standard library only)
"""

import sys
import time


def image_main(base_only: bool = False) -> int:
    from gpustack_dspark.devstack import podman as podman_host
    from gpustack_dspark.devstack.image import build_cpu_image
    from gpustack_dspark.devstack.progress import Progress

    out = Progress(sys.stderr, t0=time.time())
    try:
        config = podman_host.prepare()
        log = config.root / ("image-base-build.log" if base_only else "image-build.log")
        what = "the CPU DSpark image's Debian and runtime bases" if base_only else "the CPU DSpark image"
        out.say(f"[image] finding or building {what} (log {log})")
        step = {"line": "checking the image's inputs", "t": time.monotonic()}

        def on_line(line: str) -> None:
            step.update(line=line, t=time.monotonic())
            out.say(f"[image] {line}")

        out.phase("image", lambda: f"{step['line'][:70]} ({time.monotonic() - step['t']:.0f}s; log {log})")
        out.start_heartbeat("[image]")
        started = time.monotonic()
        image = build_cpu_image(config, log, on_line=on_line, base_only=base_only)
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
        if args[1:] not in ([], ["--base"]):
            sys.exit(f"usage: python -m gpustack_dspark.devstack image [--base] (got {' '.join(args[1:])!r})")
        sys.exit(image_main(base_only=args[1:] == ["--base"]))
    if args[:1] == ["demo"]:
        args = args[1:]
    from gpustack_dspark.devstack.demo import main

    sys.exit(main(args))

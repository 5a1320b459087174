"""Keep a process's asyncio loop from sleeping: a task that yields forever, so the loop polls its
sockets without blocking (one core busy). `python spin.py api ARGS` runs `slipstream ARGS` with the
API process's loop spinning; `python spin.py client ARGS` the same for bench-serve's client loop."""
import asyncio, sys


async def _spin():
    while True:
        await asyncio.sleep(0)


class SpinningApp:
    def __init__(self, app):
        self.app, self.task = app, None

    async def __call__(self, scope, receive, send):
        if self.task is None:
            self.task = asyncio.get_running_loop().create_task(_spin())
        await self.app(scope, receive, send)


if __name__ == "__main__":
    which = sys.argv.pop(1)
    if which == "api":
        import slipstream.server.app as app_mod
        build = app_mod.build_app
        app_mod.build_app = lambda *a, **k: SpinningApp(build(*a, **k))
    else:
        run = asyncio.run

        def spinning_run(coro, **kw):
            async def main():
                task = asyncio.get_running_loop().create_task(_spin())
                try:
                    return await coro
                finally:
                    task.cancel()
            return run(main(), **kw)
        asyncio.run = spinning_run
    from slipstream.cli import main
    sys.exit(main(sys.argv[1:]))

"""slipstream on Ray Serve, past one host: an application whose every replica is one `slipstream
serve` — the FastAPI app of server/app.py and its engine process — on one GPU (`num_gpus=1`), with
the same OpenAI and Moondream routes. Ray's proxy spreads requests over the replicas and its
controller replaces a replica that dies (the requests it held fail; the others serve on); replicas
scale between the autoscaling bounds when given.

On a Ray cluster (`ray start --head` on one node, `ray start --address=HEAD:6379` on the others):

    serve run slipstream.ray:app model=random:qwen2.5-0.5b num_replicas=4

(`min_replicas` / `max_replicas` instead of `num_replicas` to autoscale; `num_gpus=0 device=cpu`
for CPU replicas; any field of `Args`.) From Python: `serve.run(slipstream.ray.app(Args(...)))`."""
from __future__ import annotations

from pydantic import BaseModel


class Args(BaseModel):
    """The application's options (`serve run slipstream.ray:app key=value ...` parses them)."""
    model: str | None = None  # as for `slipstream serve` (None: the embedded SmolLM2)
    num_replicas: int | None = None  # a fixed count; None with min/max_replicas: autoscaled
    min_replicas: int = 1
    max_replicas: int | None = None
    target_ongoing_requests: int = 64  # the autoscaler's target per replica
    num_gpus: float = 1.0
    num_cpus: float = 1.0
    device: str | None = None  # None: the replica's GPU where it has one
    dtype: str = "auto"
    mode: str = "pipelined"
    max_num_seqs: int = 256
    max_model_len: int | None = None
    api_key: str | None = None
    max_in_flight: int = 4096  # a replica's requests at once (and Ray's max_ongoing_requests)


def app(args: Args):
    """The Ray Serve application (an `Application`, for `serve.run`; `serve run slipstream.ray:app`
    builds it from key=value arguments)."""
    from ray import serve

    options = {"mode": args.mode, "device": args.device, "dtype": args.dtype, "max_num_seqs": args.max_num_seqs,
               "step_timing": True}
    if args.max_model_len is not None:
        options["max_model_len"] = args.max_model_len
    model, api_key, max_in_flight = args.model, args.api_key, args.max_in_flight

    def asgi():  # (evaluated in each replica: its own engine process, started by the app's lifespan)
        from .server.app import build_app
        from .server.client import EngineClient

        return build_app(EngineClient(model, options), api_key, max_in_flight)

    scaling = {"num_replicas": args.num_replicas} if args.num_replicas is not None else {
        "autoscaling_config": {"min_replicas": args.min_replicas,
                               "max_replicas": args.max_replicas or args.min_replicas,
                               "target_ongoing_requests": args.target_ongoing_requests}}
    deployment = serve.deployment(serve.ingress(asgi)(type("Slipstream", (), {})), name="slipstream",
                                  max_ongoing_requests=max_in_flight,
                                  ray_actor_options={"num_gpus": args.num_gpus, "num_cpus": args.num_cpus}, **scaling)
    return deployment.bind()


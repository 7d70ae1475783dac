"""What every route needs: the engine, its names, the admission gate and the metrics."""
from __future__ import annotations

from dataclasses import dataclass, field

from fastapi import Request

from .errors import APIError
from .generation import Gate
from .metrics import ServerMetrics


@dataclass
class ServerState:
    engine: object
    gate: Gate
    served_name: str
    metrics: ServerMetrics
    aliases: set[str] = field(default_factory=set)  # other names a request may use for the model

    def check_model(self, name: str | None) -> None:
        """`model` may be omitted (vLLM); if given it must name the served model (404 otherwise, like vLLM)."""
        if name and name != self.served_name and name not in self.aliases:
            raise APIError(f"The model `{name}` does not exist.", 404, param="model", code="model_not_found")


def get_state(request: Request) -> ServerState:
    return request.app.state.server

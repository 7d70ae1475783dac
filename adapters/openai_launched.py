"""An OpenAI-compatible engine that the harness may launch itself (vLLM, TRT-LLM, ours).

Mode "server" when no `url` option is given: `self.server` is a `ManagedServer` built
from the launch options, started at `start()` and stopped (whole process group) at
`stop()`. Mode "attach" with a `url`: nothing is launched. Subclasses give the command
line (`server_argv`) and, if they need one, the environment (`server_env`).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from adapters.openai_compat import OpenAIEngine
from adapters.serving import SERVER_OPTIONS, ManagedServer


class LaunchedOpenAIEngine(OpenAIEngine):
    OPTIONS = OpenAIEngine.OPTIONS | SERVER_OPTIONS
    INSTALL = ""  # the line that says what to install when the launcher lacks the engine

    def __init__(self, model: str, dtype: str = "float32", options: dict[str, Any] | None = None):
        super().__init__(model, dtype, options)
        self.mode = "attach" if self.options.get("url") else "server"
        self.server = (ManagedServer(self.name, model, self.options, "/health", self.INSTALL)
                       if self.mode == "server" else None)

    def server_argv(self) -> list[str]:
        raise NotImplementedError

    def server_env(self, work_dir: Path | None) -> dict[str, str]:
        return {}

    async def _connect(self) -> str:
        if self.server is None:
            return await super()._connect()
        return await self.server.start(self.server_argv, self.server_env)

    async def _disconnect(self) -> None:
        if self.server is not None:
            await self.server.stop()

    def _pid(self) -> int | None:
        return self.server.pid if self.server else None

    def _knobs(self) -> dict[str, Any]:
        knobs = super()._knobs()
        if self.server is not None and self.server.proc is not None:
            knobs["log_path"] = str(self.server.proc.log_path)
            knobs["startup_s"] = round(self.server.proc.start_s or 0.0, 1)
        return knobs

"""papermill's engine for the kit's runs: its notebook client keeps at most a run's allowance of cell outputs,
writes the executed notebook once (when the run is over), and ends a kernel whose cell asked it to exit.
Registered with papermill on import, which only a run that starts a kernel makes (`kernel.papermill_run`).
"""

from __future__ import annotations

import json

import nbformat
from papermill.clientwrap import PapermillNotebookClient
from papermill.engines import NBClientEngine, papermill_engines
from papermill.log import logger

from labkit.run import allowance

ENGINE = "labkit"


class CappedClient(PapermillNotebookClient):
    """Keeps at most `output_limit` bytes of cell outputs; a note says where they were cut.

    Errors are always kept (shortened), so that a cell that raised is still reported.
    """

    def __init__(self, nb_man, output_limit: int, **kw):
        super().__init__(nb_man, **kw)
        self.output_limit, self.output_kept, self.output_cut = output_limit, 0, False

    def output(self, outs, msg, display_id, cell_index):
        content = msg.get("content", {})
        if msg.get("msg_type") == "error":
            content["traceback"] = list(content.get("traceback", []))[-20:]
            content["evalue"] = str(content.get("evalue", ""))[:2000]
            return super().output(outs, msg, display_id, cell_index)
        size = len(json.dumps(content, default=str))
        note = f"\n[labkit: output cut here: the run's outputs passed {allowance.format_size(self.output_limit)}]\n"
        room = self.output_limit - self.output_kept
        if size > room and not self.output_cut:
            self.output_cut = True
            if msg.get("msg_type") == "stream" and room > 1000:  # the start of a long stream is kept
                content["text"] = str(content.get("text", ""))[: room - 1000] + note
                size = room
            else:
                outs.append(nbformat.v4.new_output("stream", name="stderr", text=note.lstrip("\n")))
                return None
        elif size > room:
            return None
        self.output_kept += size
        return super().output(outs, msg, display_id, cell_index)

    async def _check_raise_for_error(self, cell, cell_index, exec_reply):
        # exit() in a cell stops the kernel a moment later, while the next cells may still be sent: end it
        # now, so that a notebook that asks to exit always ends the same way, whatever the machine's load.
        payload = ((exec_reply or {}).get("content") or {}).get("payload") or []
        if hasattr(self.km, "stop_kernel") and any(
            p.get("source") == "ask_exit" and not p.get("keepkernel") for p in payload
        ):
            self.km.asked_to_exit = True
            self.km.stop_kernel()
        return await super()._check_raise_for_error(cell, cell_index, exec_reply)


class Engine(NBClientEngine):
    @classmethod
    def execute_managed_notebook(
        cls,
        nb_man,
        kernel_name,
        log_output=False,
        stdout_file=None,
        stderr_file=None,
        start_timeout=60,
        execution_timeout=None,
        **kwargs,
    ):
        kwargs.pop("input_path", None)
        # papermill writes the whole notebook before and after every cell (two thirds of the trusted side's
        # time in a grading run); the kit reads it only when the run is over, so it is written once, by
        # papermill's own `notebook_complete`, which runs however the execution ends
        path, nb_man.output_path = nb_man.output_path, None
        try:
            return CappedClient(
                nb_man,
                kernel_name=kernel_name,
                timeout=execution_timeout,
                startup_timeout=start_timeout,
                log=logger,
                log_output=log_output,
                stdout_file=stdout_file,
                stderr_file=stderr_file,
                **kwargs,
            ).execute()
        finally:
            nb_man.output_path = path


papermill_engines.register(ENGINE, Engine)

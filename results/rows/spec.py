"""What a report is over: its name, the experiments and filter that chose its runs, the store they
came from, the key metric and the lines it opens with. Written beside the report as ``report.json``
so that the folder can be rebuilt whole from its data (``make reports``)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from results.rows.frame import ResultsError

SPEC_FILE = "report.json"


@dataclass(frozen=True)
class ReportSpec:
    name: str
    experiments: tuple[str, ...] = ()
    tracking_uri: str = ""
    filter_string: str = ""
    metric: str = "val_loss"
    opening: tuple[str, ...] = field(default_factory=tuple)

    def write(self, folder: Path) -> Path:
        path = folder / SPEC_FILE
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")
        return path

    @classmethod
    def read(cls, folder: Path) -> ReportSpec:
        path = folder / SPEC_FILE
        try:
            data = json.loads(path.read_text())
            return cls(
                name=str(data["name"]),
                experiments=tuple(data.get("experiments", ())),
                tracking_uri=str(data.get("tracking_uri", "")),
                filter_string=str(data.get("filter_string", "")),
                metric=str(data.get("metric", "val_loss")),
                opening=tuple(data.get("opening", ())),
            )
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise ResultsError(
                f"{path}: cannot be read ({type(error).__name__}: {error}); a folder rebuilt from its data needs "
                "the report.json mesh-results writes"
            ) from None


__all__ = ["SPEC_FILE", "ReportSpec"]

"""The project's one version number: the chart's appVersion. Its chart `version`, the images' tags (`make images`
tags the operator image with it, the CPU worker image with `<version>-cpu`) and the operator's package version
agree with it (tests/unit/test_versions.py); `make release VERSION=x.y.z` moves them all."""

from __future__ import annotations

from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "elasticjob-operator"
VERSION: str = str(yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"])

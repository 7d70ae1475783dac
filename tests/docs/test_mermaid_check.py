"""The mermaid checker accepts the diagram forms the handbook uses and rejects broken ones."""
from __future__ import annotations

import pytest

from tests.docs.mermaid_check import check

GOOD = {
    "flowchart": 'flowchart LR\n  A["text: (x)"] --> B{choice}\n  B -->|yes| C[(store)] & D(["end"])\n'
                 '  subgraph S ["group"]\n    E[e] -.-> F((f))\n  end\n  C --- S\n  A -- label --> F\n',
    "graph": "graph TD\n  a --> b; b ==> c\n",
    "sequence": "sequenceDiagram\n  participant A as Client\n  participant B\n  A->>B: hello (1)\n"
                "  alt ok\n    B-->>A: fine\n  else not ok\n    B--xA: no\n  end\n  loop again\n"
                "    A->>A: self\n  end\n  Note over A,B: done\n",
    "state": "stateDiagram-v2\n  [*] --> W: add\n  W --> R\n  R --> [*]\n  state R {\n    x --> y\n  }\n"
             "  R : running\n  note right of R\n    text\n  end note\n",
}
BAD = {
    "unknown type": "pie\n  a: 1",
    "no statements": "flowchart LR",
    "bad direction": "flowchart XY\n  A --> B",
    "unclosed bracket": "flowchart LR\n  A[x --> B",
    "odd quote": 'flowchart LR\n  A["x] --> B',
    "dangling arrow": "flowchart LR\n  A -->",
    "not an arrow": "flowchart LR\n  A ~~> B",
    "open subgraph": "flowchart LR\n  subgraph X\n  A --> B",
    "stray end": "flowchart LR\n  A --> B\n  end",
    "message without colon": "sequenceDiagram\n  A->>B hello",
    "unclosed loop": "sequenceDiagram\n  loop x\n  A->>B: hi",
    "else outside alt": "sequenceDiagram\n  else x\n  A->>B: hi",
    "bad note": "sequenceDiagram\n  Note A: x",
    "state arrow": "stateDiagram-v2\n  A -> B",
    "open state": "stateDiagram-v2\n  state X {\n  A --> B",
}


@pytest.mark.parametrize("name", GOOD)
def test_accepts(name):
    assert check(GOOD[name]) == []


@pytest.mark.parametrize("name", BAD)
def test_rejects(name):
    assert check(BAD[name]), f"{name} passed"

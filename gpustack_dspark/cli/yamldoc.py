"""Multi-document YAML with line numbers, for error messages (pure: text in, documents out).

PyYAML's data loader forgets where a value came from and silently keeps the last of two
equal keys; composing the node tree keeps both facts. Each document comes back as plain
data plus a map from field path to its 1-based line.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import yaml

from gpustack_dspark import bounded

Path = Tuple[Any, ...]  # ("dspark", "warmup", "requests") or ("backend_parameters", 3)


class SpecError(Exception):
    """One problem in one document: file, document, field path, line, value, what is allowed."""

    def __init__(self, file: str, doc: Optional[int], name: Optional[str], path: str,
                 line: Optional[int], message: str):
        self.file, self.doc, self.name, self.path, self.line = file, doc, name, path, line
        self.message = message
        parts = [file]
        if doc is not None:
            parts.append(f"document {doc}" + (f" ({name})" if name else ""))
        if path:
            parts.append(path + (f" (line {line})" if line else ""))
        elif line:
            parts.append(f"line {line}")
        super().__init__(": ".join(parts) + ": " + message)


@dataclass
class Document:
    index: int  # 1-based, as users count them
    data: Any
    lines: Dict[Path, int] = field(default_factory=dict)
    line: Optional[int] = None  # where the document starts

    def line_of(self, path: Path) -> Optional[int]:
        """The line of `path`, or of its nearest parent that has one."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return self.line


def dotted(path: Path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def load_documents(text: str, file: str) -> List[Document]:
    """Every non-empty document of `text`; SpecError for YAML that does not parse or
    repeats a key."""
    try:
        bounded.check_yaml(text, bounded.MODEL_FILE)
        nodes = list(yaml.compose_all(text, Loader=yaml.SafeLoader))
        datas = list(yaml.safe_load_all(text))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        raise SpecError(file, None, None, "", mark.line + 1 if mark else None,
                        f"not valid YAML: {problem}") from None
    except bounded.BoundedError as e:
        raise SpecError(file, None, None, "", e.line, e.problem) from None
    docs: List[Document] = []
    for position, (node, data) in enumerate(zip(nodes, datas), start=1):
        if node is None or data is None:  # a leading or trailing `---`
            continue
        doc = Document(len(docs) + 1, data, line=node.start_mark.line + 1)
        _walk(node, (), doc, file)
        docs.append(doc)
    return docs


def _walk(node: yaml.Node, path: Path, doc: Document, file: str) -> None:
    if isinstance(node, yaml.MappingNode):
        seen: Dict[str, int] = {}
        for key_node, value_node in node.value:
            key = key_node.value
            line = key_node.start_mark.line + 1
            if key in seen:
                name = doc.data.get("name") if isinstance(doc.data, dict) else None
                raise SpecError(file, doc.index, name if isinstance(name, str) else None,
                                dotted(path + (key,)), line,
                                f"given twice (first on line {seen[key]}); keep one")
            seen[key] = line
            doc.lines[path + (key,)] = line
            _walk(value_node, path + (key,), doc, file)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            doc.lines[path + (i,)] = item.start_mark.line + 1
            _walk(item, path + (i,), doc, file)

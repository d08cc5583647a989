"""Schemas of our own in the shapes the grammar engines read wider than JSON Schema
(worker/normalize.py, the narrowed retry), shared by the unit and integration tests."""

# Keywords beside a oneOf of required-only branches (Glaive's calculate_area family).
AREA = {"type": "object", "properties": {k: {"type": "number"} for k in ("radius", "length", "width", "base", "height")},
        "oneOf": [{"required": ["radius"]}, {"required": ["length", "width"]}, {"required": ["base", "height"]}]}
# A oneOf whose branches overlap: an object with neither key, or a string "cat", satisfies both.
PETS = {"type": "object", "oneOf": [{"properties": {"dog": {"type": "string"}}}, {"properties": {"cat": {"type": "string"}}}]}
# A discriminated union of if/then conditionals on a required key, as JSON Schema Store writes them.
FORM = {
    "definitions": {"kind": {"type": "string", "enum": ["note", "input", "choice"]}},
    "type": "object", "required": ["kind"], "properties": {"kind": {"$ref": "#/definitions/kind"}},
    "allOf": [
        {"if": {"properties": {"kind": {"const": "note"}}},
         "then": {"type": "object", "required": ["kind", "text"], "additionalProperties": False,
                  "properties": {"kind": {"$ref": "#/definitions/kind"}, "text": {"type": "string"}}}},
        {"if": {"properties": {"kind": {"const": "input"}}, "required": ["kind"]},
         "then": {"type": "object", "required": ["kind", "label"], "additionalProperties": False,
                  "properties": {"kind": {"$ref": "#/definitions/kind"}, "label": {"type": "string"},
                                 "optional": {"type": "boolean"}}}}]}

"""Schemathesis hooks for .ci/steps/schemathesis.sh (loaded via SCHEMATHESIS_HOOKS).

The published OpenAPI document leaves response objects open (no
`additionalProperties: false`), so clients generated from it keep working
when a later version adds a field. The fuzz run is stricter: it closes every
object schema of the document's components that does not say otherwise, so a
field the server sends but the document does not describe fails
response_schema_conformance. Schemas that are open on purpose (ErrorDetail's
code-specific fields) declare `additionalProperties` and are left alone.
"""

import schemathesis


@schemathesis.hook
def before_load_schema(context, raw_schema):
    schemas = raw_schema.get("components", {}).get("schemas", {})
    for schema in schemas.values():
        if schema.get("type") == "object" and "additionalProperties" not in schema:
            schema["additionalProperties"] = False

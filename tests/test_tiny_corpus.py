"""The tiny tokenizers' stored corpus is the attribute schema's text: if the schema changes,
this fails, and the corpus (and with it the tiny tokenizers) is regenerated on purpose."""

import json

from stereolens.contextbias.schema import AttributeSchema
from stereolens.models.tiny.vlm import schema_corpus


def test_stored_corpus_matches_the_attribute_schema():
    schema = AttributeSchema.load()
    vlm = [json.dumps(schema.json_schema), json.dumps(schema.json_schema, indent=2)]
    twins = [json.dumps(schema.json_schema)]
    for d in schema.dimensions:
        labels = list(d.vocabulary or ()) + ["unknown"]
        vlm += [json.dumps({d.name: labels}), ", ".join(f'"{d.name}": "{v}"' for v in labels)]
        twins.append(json.dumps({d.name: labels}))
    assert schema_corpus("tiny_vlm") == vlm
    assert schema_corpus("twins") == twins

"""Every released version of the contract stays readable by the current schemas (schema evolution)."""

from __future__ import annotations

import io

import fastavro
import pytest
from fastavro.utils import generate_many

from schemas import COMMAND, DEAD_LETTER, EVENT, SNAPSHOT, registry
from schemas.codec import HISTORY, MAGIC

RECORDS = (COMMAND, EVENT, SNAPSHOT, DEAD_LETTER)


@pytest.mark.parametrize("version", HISTORY)
def test_every_released_writer_schema_is_known_by_its_fingerprint(version: str) -> None:
    """The registry knows each released record schema by its fingerprint, under the right name."""
    codecs = registry()
    for name in RECORDS:
        fingerprint = codecs.versions[version][name]
        writer = codecs.writer_schema(fingerprint)
        assert writer is not None and writer["name"] == name


@pytest.mark.parametrize("version", HISTORY)
@pytest.mark.parametrize("name", RECORDS)
def test_records_of_a_released_version_decode_under_the_current_schema(version: str, name: str) -> None:
    """Random records written with a released writer schema decode with the current reader (defaults filled)."""
    codecs = registry()
    fingerprint = codecs.versions[version][name]
    writer = codecs.writer_schema(fingerprint)
    codec = codecs.codec(name)
    for record in generate_many(writer, 25):
        buffer = io.BytesIO()
        buffer.write(MAGIC + fingerprint)
        fastavro.schemaless_writer(buffer, writer, record)
        decoded = codec.decode(buffer.getvalue())
        assert isinstance(decoded, dict)

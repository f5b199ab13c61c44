"""What a job weighs in the predicted wait: tokens estimated from its text."""

from deployments.core.admission.job_work import (
    PER_SEQUENCE_TOKENS,
    embed_work,
    rerank_work,
    work_of,
)
from deployments.core.protocol import EmbedJob, RerankJob


def test_an_embedding_weighs_its_tokens_plus_a_charge_per_input() -> None:
    short = EmbedJob(texts=["a query"] * 10)  # 7 characters: 1 token each
    long = EmbedJob(texts=["x" * 1600])  # 400 tokens
    assert embed_work(short) == 10 * (1 + PER_SEQUENCE_TOKENS)
    assert embed_work(long) == 400 + PER_SEQUENCE_TOKENS
    # one long document is more work than ten short queries, as in a pass
    assert embed_work(long) > 4 * embed_work(short)


def test_an_input_weighs_no_more_than_the_model_reads_of_it() -> None:
    huge = EmbedJob(texts=["x" * 400_000])
    assert embed_work(huge, window=256) == 256 + PER_SEQUENCE_TOKENS


def test_token_ids_are_counted_as_given() -> None:
    job = EmbedJob(token_ids=[[1] * 30, [2] * 5])
    assert embed_work(job) == 35 + 2 * PER_SEQUENCE_TOKENS


def test_rerank_counts_the_documents_and_the_query_beside_every_chunk() -> None:
    job = RerankJob(query="q" * 40, documents=["d" * 400, "d" * 40], chunk_passes=2)
    # documents 100 + 10 tokens; each chunk reads the query (10) and 3 specials again
    assert rerank_work(job) == 110 + 2 * (10 + 3 + PER_SEQUENCE_TOKENS)
    capped = RerankJob(query="q", documents=["d" * 4000], max_tokens_per_doc=100)
    assert rerank_work(capped) == 100 + 1 * (0 + 3 + PER_SEQUENCE_TOKENS)


def test_work_of_picks_by_job_and_counts_other_jobs_by_inputs() -> None:
    weigh = work_of(window=64)
    assert weigh(EmbedJob(texts=["x" * 4000])) == 64 + PER_SEQUENCE_TOKENS
    assert weigh(["one", "two", "three"]) == 3 * PER_SEQUENCE_TOKENS

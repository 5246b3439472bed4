"""The seeded random schedule over HTTP on the shipped proxy: the official openai client, streaming
and not, completions and chat, header and body budgets 1..E and dense, client aborts: zero 5xx."""

import asyncio

from base_sglang.testing.schedule import check_http, random_schedule, serve_over_http, token_pool


def test_random_schedule_over_http_has_no_5xx(proxy_server):
    engine = proxy_server.backend.engine
    pool = token_pool(engine.tokenizer)
    schedule = random_schedule(pool, engine.num_experts, engine.runner.patch.top_k,
                               num_requests=200, seed=77, max_tokens=16, abort_share=0.1)
    served = asyncio.run(serve_over_http(proxy_server.url, "proxy-moe", engine.tokenizer,
                                         schedule))
    assert check_http(served) == []
    assert sum(s.aborted for s in served.values()) >= 5
    assert {s.route for s in served.values()} == {"chat", "completions"}
    assert engine.stats.num_decode_steps > 0 and engine.runner.kv.num_rows == 0

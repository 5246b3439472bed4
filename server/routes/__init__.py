"""HTTP routes. Every /v1 route documents the error answers it can give (OpenAI's error body)."""

from typing import Annotated

from fastapi import Header

from base_sglang.core.budget import BUDGET_HEADER
from base_sglang.server.schemas import ErrorResponse

ERROR_RESPONSES = {
    400: {"model": ErrorResponse, "description": "invalid request; `param` names the field"},
    401: {"model": ErrorResponse, "description": "missing or wrong API key"},
    404: {"model": ErrorResponse, "description": "unknown model"},
    413: {"model": ErrorResponse, "description": "request body over --max-request-bytes"},
    500: {"model": ErrorResponse, "description": "the request failed inside the engine"},
    503: {"model": ErrorResponse, "description": "queue full or shutting down; see Retry-After"},
}
budget_header_doc = ("experts each MoE layer may execute per decode step for this request: an "
                     "integer 1..E or \"dense\" (the body field expert_budget wins)")
BUDGET_HEADER_SCHEMA = {"pattern": "^\\s*([Dd][Ee][Nn][Ss][Ee]|[+]?[0-9]+)\\s*$"}
# the X-Expert-Budget request header of the generation routes (documented; read by deps.resolve_budget)
BudgetHeader = Annotated[str, Header(alias=BUDGET_HEADER, description=budget_header_doc,
                                     json_schema_extra=BUDGET_HEADER_SCHEMA)]

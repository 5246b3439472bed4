"""GET /v1/models and /v1/models/{id}: the one served model, with its expert count, policy and
context length."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request

from base_sglang.server.deps import check_model, require_api_key
from base_sglang.server.routes import ERROR_RESPONSES
from base_sglang.server.schemas import ModelCard, ModelList

router = APIRouter(dependencies=[Depends(require_api_key)])
_STARTED = int(time.time())
_ERRORS = {k: v for k, v in ERROR_RESPONSES.items() if k in (401, 404)}


def _card(request: Request) -> ModelCard:
    b = request.app.state.backend
    return ModelCard(id=b.name, created=_STARTED, num_experts=b.num_experts, policy=b.policy,
                     max_model_len=b.max_model_len)


@router.get("/v1/models", response_model=ModelList, responses=_ERRORS)
async def list_models(request: Request) -> ModelList:
    request.app.state.metrics.observe_response("models", 200)
    return ModelList(data=[_card(request)])


@router.get("/v1/models/{model_id:path}", response_model=ModelCard, responses=_ERRORS)
async def get_model(model_id: str, request: Request) -> ModelCard:
    check_model(request, model_id)
    request.app.state.metrics.observe_response("models", 200)
    return _card(request)

"""GET /v1/models: the one served model, with its expert count and selection policy."""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Request

from base_sglang.server.deps import require_api_key
from base_sglang.server.schemas import ModelCard, ModelList

router = APIRouter(dependencies=[Depends(require_api_key)])
_STARTED = int(time.time())


@router.get("/v1/models", response_model=ModelList)
async def list_models(request: Request) -> ModelList:
    b = request.app.state.backend
    return ModelList(data=[ModelCard(id=b.name, created=_STARTED, num_experts=b.num_experts,
                                     policy=b.policy)])

"""The Responses API (/v1/responses): the request's translation to a chat completion (`responses_request`),
the view (`responses_api`), the rendering of its answer and events (`responses_render`) and the stored
responses a later request may continue (`responses_store`)."""

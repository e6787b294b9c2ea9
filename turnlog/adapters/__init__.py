"""Framework adapters: a LiveKit, Pipecat, OpenAI Agents SDK or LangGraph agent
records its conversation through :class:`turnlog.producers.SessionRecorder`.

Each adapter is its own module and its own optional extra
(``pip install 'turnlog[livekit]'``, ``[pipecat]``, ``[openai-agents]``,
``[langgraph]``); importing this package imports no framework.
"""

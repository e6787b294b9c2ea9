"""The LangGraph stream mirror, driven by a real StateGraph (checkpointer, tool step)
whose node calls a scripted chat model, on the real broker and Postgres."""

from __future__ import annotations

import asyncio
import uuid
from contextlib import aclosing

import pytest

from tests.support import recorder_for, require_extra

require_extra("langgraph", "langgraph")

from langchain_core.messages import AIMessageChunk, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from turnlog.adapters.langgraph import LangGraphMirror
from turnlog.schemas.session_keys import session_key

from tests.adapters.langgraph_fakes import ScriptedChat, chat_graph, clarify_graph, reply, review_graph
from tests.adapters.scripted import TURNS_AFTER_A_KILL_MID_ANSWER, kill_mid_answer_then_resume
from tests.adapters.stored import FLEET, turns
from tests.integration.test_pipeline import finalized
from tests.support import wait_until

TIMEOUT = 120


def config(thread_id):
    return {"configurable": {"thread_id": thread_id}}


SPEAKERS = {"human": "user", "ai": "assistant"}


def held(messages):
    """The conversation a graph holds: (speaker, text) of its human and AI messages with text."""
    return [(SPEAKERS[m.type], m.content) for m in messages if m.type in SPEAKERS and m.content]


def stored_conversation(pipeline, key):
    """(speaker, text) of the stored turns of the session keyed ``key``, which must be complete, not cut
    short, and numbered 0, 1, 2..."""
    rows = turns(pipeline, key)
    assert [(r[0], r[3], r[6]) for r in rows] == [(n, "complete", False) for n in range(len(rows))]
    return [(r[1], r[2]) for r in rows]


async def run_exchanges(pipeline, thread, graph, questions, **mirror_kwargs):
    """Ask ``questions`` through a mirror, end the session, wait until it is finalized; the graph's final state."""
    async with recorder_for(pipeline.settings) as recorder:
        mirror = await LangGraphMirror.open(recorder, thread, fleet=FLEET, agent_id="bot", **mirror_kwargs)
        for question in questions:
            async for _ in mirror.astream(graph, {"messages": [("user", question)]}, config(thread)):
                pass
        await mirror.end("completed")
    key = session_key(FLEET, thread)
    await asyncio.to_thread(wait_until, lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{thread} finalized")
    return await graph.aget_state(config(thread))


async def test_the_mirror_records_the_conversation_partials_tokens_and_tool_calls(pipeline):
    thread = f"lg-run-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, thread)
    call = {"name": "order_status", "args": {"order": "42"}, "id": "call-1", "type": "tool_call"}
    model = ScriptedChat(replies=iter([
        reply("ai-1", tool_calls=[call], input_tokens=11, output_tokens=3),
        reply("ai-2", "Your order 42 ships tomorrow.", input_tokens=25, output_tokens=7),
        reply("ai-3", "You are welcome!", input_tokens=40, output_tokens=4),
    ]), seen=[])
    graph = chat_graph(model, InMemorySaver())
    async with recorder_for(pipeline.settings) as recorder:
        mirror = await LangGraphMirror.open(recorder, thread, fleet=FLEET, agent_id="support")
        modes, chunks = set(), 0
        async for mode, chunk in mirror.astream(graph, {"messages": [("user", "Where is order 42?")]}, config(thread)):
            modes.add(mode)
            if mode == "messages" and isinstance(chunk[0], AIMessageChunk) and chunk[0].id == "ai-2" and chunk[0].content:
                chunks += 1
                if chunks == 3:  # the partial is the text streamed so far
                    await mirror.recorded.flush_partial()
                    partial = await asyncio.to_thread(
                        wait_until, lambda: [t for t in turns(pipeline, key) if t[0] == 1],
                        timeout=TIMEOUT, what="the streamed partial stored",
                    )
                    assert partial == [(1, "assistant", "Your order 42 ", "partial", 0, 0, False, None)]
        assert modes == {"messages", "updates"}
        async for mode, _ in mirror.astream(graph, {"messages": [HumanMessage("Thanks!")]}, config(thread), stream_mode="values"):
            modes.add(mode)
        assert modes == {"messages", "updates", "values"}
        await mirror.end("completed")
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{thread} finalized")
    recorded_call = {"name": "order_status", "arguments": {"order": "42"}, "result": "order 42 ships tomorrow"}
    assert turns(pipeline, key) == [
        (0, "user", "Where is order 42?", "complete", 0, 0, False, None),
        (1, "assistant", "Your order 42 ships tomorrow.", "complete", 36, 10, False, [recorded_call]),
        (2, "user", "Thanks!", "complete", 0, 0, False, None),
        (3, "assistant", "You are welcome!", "complete", 40, 4, False, None),
    ]
    state = await graph.aget_state(config(thread))
    assert [m.content for m in state.values["messages"] if m.type in ("human", "ai") and m.content] == [
        "Where is order 42?", "Your order 42 ships tomorrow.", "Thanks!", "You are welcome!",
    ]


async def test_the_turn_spans_carry_the_graphs_thread_id_as_langsmith_does(pipeline, recorder_spans):
    """With turnlog's tracing on, every turn's span carries the thread id LangGraph puts in its
    runs' metadata, under the key LangSmith's OpenTelemetry exporter gives it
    (``langsmith.metadata.thread_id``)."""
    thread = f"lg-trace-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, thread)
    call = {"name": "order_status", "args": {"order": "42"}, "id": "call-1", "type": "tool_call"}
    model = ScriptedChat(replies=iter([
        reply("ai-1", tool_calls=[call]),
        reply("ai-2", "Your order 42 ships tomorrow."),
    ]), seen=[])
    graph = chat_graph(model, InMemorySaver())
    in_metadata = set()
    async with recorder_for(pipeline.settings) as recorder:
        mirror = await LangGraphMirror.open(recorder, thread, fleet=FLEET, agent_id="support")
        async for mode, chunk in mirror.astream(graph, {"messages": [("user", "Where is order 42?")]}, config(thread)):
            if mode == "messages":
                in_metadata.add(chunk[1].get("thread_id"))  # LangGraph's run metadata
        await mirror.end("completed")

    assert in_metadata == {thread}
    spans = recorder_spans.turns(key)
    assert [(index, spans[index]["turnlog.speaker"], spans[index].get("langsmith.metadata.thread_id"))
            for index in sorted(spans)] == [(0, "user", thread), (1, "assistant", thread)]


async def test_a_stream_cut_short_keeps_the_words_seen_as_a_barged_in_turn(pipeline):
    thread = f"lg-cut-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, thread)
    model = ScriptedChat(replies=iter([reply("ai-1", "Let me read you all the terms and conditions.", output_tokens=9)]), seen=[])
    graph = chat_graph(model, InMemorySaver())
    async with recorder_for(pipeline.settings) as recorder:
        mirror = await LangGraphMirror.open(recorder, thread, fleet=FLEET, agent_id="talker")
        words = 0
        async with aclosing(mirror.astream(graph, {"messages": [("user", "Tell me the terms")]}, config(thread))) as stream:
            async for mode, chunk in stream:
                if mode == "messages" and isinstance(chunk[0], AIMessageChunk) and chunk[0].content:
                    words += 1
                    if words == 3:
                        break  # the user stops the answer
        await mirror.end("completed")
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{thread} finalized")
    assert turns(pipeline, key) == [
        (0, "user", "Tell me the terms", "complete", 0, 0, False, None),
        (1, "assistant", "Let me read ", "complete", 0, 0, True, None),
    ]


async def test_a_resumed_thread_whose_checkpointer_lost_it_continues_from_turnlog(pipeline):
    thread = f"lg-rebuild-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, thread)
    first = ScriptedChat(replies=iter([reply("ai-1", "Hello, Ada.", output_tokens=3)]), seen=[])
    async with recorder_for(pipeline.settings) as recorder:
        mirror = await LangGraphMirror.open(recorder, thread, fleet=FLEET, agent_id="bot")
        async for _ in mirror.astream(chat_graph(first, InMemorySaver()), {"messages": [("user", "I am Ada")]}, config(thread)):
            pass
    # A new process with a new in-memory checkpointer: the thread is gone there, not in turnlog.
    model = ScriptedChat(replies=iter([reply("ai-2", "You are Ada.", input_tokens=8, output_tokens=3)]), seen=[])
    graph = chat_graph(model, InMemorySaver())
    async with recorder_for(pipeline.settings) as recorder:
        mirror = await LangGraphMirror.open(recorder, thread, fleet=FLEET, agent_id="bot")
        assert mirror.recorded.epoch == 1
        assert [(m.type, m.content) for m in mirror.history] == [("human", "I am Ada"), ("ai", "Hello, Ada.")]
        async for _ in mirror.astream(graph, {"messages": [("user", "Who am I?")]}, config(thread)):
            pass
        await mirror.end("completed")
    assert [(m.type, m.content) for m in model.seen[0]] == [("human", "I am Ada"), ("ai", "Hello, Ada."), ("human", "Who am I?")]
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{thread} finalized")
    assert [t[:6] for t in turns(pipeline, key)] == [
        (0, "user", "I am Ada", "complete", 0, 0),
        (1, "assistant", "Hello, Ada.", "complete", 0, 3),
        (2, "user", "Who am I?", "complete", 0, 0),
        (3, "assistant", "You are Ada.", "complete", 8, 3),
    ]


def test_an_agent_killed_mid_answer_resumes_with_its_thread_rebuilt_from_turnlog(new_pipeline, tmp_path):
    pipeline = new_pipeline(("sequencer", "sink"))
    thread = f"lg-crash-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, thread)
    report = kill_mid_answer_then_resume("tests.adapters.langgraph_script", thread, pipeline.settings, tmp_path, TIMEOUT)
    asked = [["human", "question 0"], ["ai", "answer 0"], ["human", "question 1"], ["ai", "answer 1"], ["human", "question 2"]]
    assert report["model_saw"] == [*asked, ["human", "question 3"]]  # the thread rebuilt from turnlog
    assert report["epoch"] == 1
    # The tool call answer 1 made before the kill is in the rebuilt thread, before the answer, as the graph held it.
    call = [["tool_call", "order_status", {"order": "1"}], ["tool_result", "order 1 ships tomorrow"]]
    assert report["model_saw_items"] == [*asked[:3], *call, *asked[3:], ["human", "question 3"]]

    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{thread} finalized")
    assert [t[:6] for t in turns(pipeline, key)] == TURNS_AFTER_A_KILL_MID_ANSWER
    stored_call = {"name": "order_status", "arguments": {"order": "1"}, "result": "order 1 ships tomorrow"}
    assert [(t[0], t[7]) for t in turns(pipeline, key) if t[7]] == [(3, [stored_call])]


def test_every_graph_shape_is_recorded_once_across_a_kill_and_resume(new_pipeline, tmp_path):
    """A router's model call, a wrapped output returned in the whole list, a preamble with a tool
    call: stored turn by turn as the graph holds them, before the kill and after the resume."""
    pipeline = new_pipeline(("sequencer", "sink"))
    thread = f"lg-shapes-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, thread)
    report = kill_mid_answer_then_resume("tests.adapters.langgraph_shapes_script", thread, pipeline.settings, tmp_path, TIMEOUT)
    before = [["human", "question 0"], ["ai", "Let me check."], ["ai", "Order 42 ships tomorrow."], ["human", "question 1"]]
    assert report["epoch"] == 1
    # the thread rebuilt from turnlog: the preamble is the message that made the call, its result after it
    assert report["model_saw"] == [*before[:2], ["tool", "order 42 ships tomorrow"], *before[2:], ["human", "question 2"]]
    graph_holds = [m for m in report["graph_holds"] if m[0] in SPEAKERS and m[1]]
    assert graph_holds == [*before, ["human", "question 2"], ["ai", "answer 2"]]

    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{thread} finalized")
    stored = turns(pipeline, key)
    assert stored[4][:4] == (4, "assistant", "answer 1 is on ", "interrupted")  # the words flushed before the kill
    complete = [t for t in stored if t[0] != 4]
    assert [(t[3], t[6]) for t in complete] == [("complete", False)] * 6
    assert [[{"user": "human", "assistant": "ai"}[t[1]], t[2]] for t in complete] == graph_holds
    recorded_call = {"name": "order_status", "arguments": {"order": "42"}, "result": "order 42 ships tomorrow"}
    assert [(t[0], t[4], t[5], t[7]) for t in complete if t[1] == "assistant"] == [
        (1, 10, 4, [recorded_call]), (2, 20, 5, None), (6, 13, 2, None),
    ]


def test_the_example_imports_without_network_or_api_keys(import_example):
    module = import_example("langgraph_agent.py")
    assert set(module.graph.nodes) >= {"chat"} and callable(module.main)


async def test_subgraphs_and_the_v2_stream_are_refused(pipeline):
    async with recorder_for(pipeline.settings) as recorder:
        mirror = await LangGraphMirror.open(recorder, f"lg-refuse-{uuid.uuid4().hex[:8]}", fleet=FLEET, agent_id="bot")
        graph = chat_graph(ScriptedChat(replies=iter([]), seen=[]), InMemorySaver())
        for kwargs in ({"subgraphs": True}, {"version": "v2"}):
            with pytest.raises(ValueError):
                async for _ in mirror.astream(graph, {"messages": [("user", "hi")]}, config("t"), **kwargs):
                    pass
        await mirror.end("completed")


async def test_a_resumed_mirror_records_what_the_checkpointer_saved_past_turnlog(pipeline):
    """The process died after the checkpointer saved an exchange and before the mirror saw it."""
    thread = f"lg-catchup-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, thread)
    model = ScriptedChat(replies=iter([
        reply("ai-1", "Hello, Ada.", output_tokens=3),
        reply("ai-2", "Noted: blue.", input_tokens=6, output_tokens=2),
        reply("ai-3", "Blue.", output_tokens=1),
    ]), seen=[])
    graph = chat_graph(model, InMemorySaver())  # the checkpointer outlives the "process"
    async with recorder_for(pipeline.settings) as recorder:
        mirror = await LangGraphMirror.open(recorder, thread, fleet=FLEET, agent_id="bot")
        async for _ in mirror.astream(graph, {"messages": [("user", "I am Ada")]}, config(thread)):
            pass
        async for _ in graph.astream({"messages": [("user", "I like blue")]}, config(thread)):
            pass  # not mirrored: as if killed before the updates reached the mirror
    async with recorder_for(pipeline.settings) as recorder:
        mirror = await LangGraphMirror.open(recorder, thread, fleet=FLEET, agent_id="bot")
        async for _ in mirror.astream(graph, {"messages": [("user", "My colour?")]}, config(thread)):
            pass
        await mirror.end("completed")
    assert [(m.type, m.content) for m in model.seen[2]][-3:] == [("human", "I like blue"), ("ai", "Noted: blue."), ("human", "My colour?")]
    wait_until(lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{thread} finalized")
    assert [t[:6] for t in turns(pipeline, key)] == [
        (0, "user", "I am Ada", "complete", 0, 0),
        (1, "assistant", "Hello, Ada.", "complete", 0, 3),
        (2, "user", "I like blue", "complete", 0, 0),
        (3, "assistant", "Noted: blue.", "complete", 6, 2),
        (4, "user", "My colour?", "complete", 0, 0),
        (5, "assistant", "Blue.", "complete", 0, 1),
    ]


async def test_a_node_that_returns_the_whole_list_records_each_message_once(pipeline):
    """add_messages gives the input's messages ids; the node writes them back with those ids."""
    thread = f"lg-whole-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, thread)
    model = ScriptedChat(replies=iter([reply("ai-1", "Hello, Ada.", output_tokens=3), reply("ai-2", "Bye, Ada.", output_tokens=2)]), seen=[])
    graph = chat_graph(model, InMemorySaver(), whole_list=True)
    state = await run_exchanges(pipeline, thread, graph, ["hi, I am Ada", "bye"])
    assert stored_conversation(pipeline, key) == held(state.values["messages"]) == [
        ("user", "hi, I am Ada"), ("assistant", "Hello, Ada."), ("user", "bye"), ("assistant", "Bye, Ada."),
    ]
    assert [t[5] for t in turns(pipeline, key)] == [0, 3, 0, 2]


async def test_a_node_that_wraps_the_models_output_completes_the_streamed_turn(pipeline):
    """The written AIMessage has another id than the streamed chunks: it completes the turn its node streamed."""
    thread = f"lg-wrap-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, thread)
    model = ScriptedChat(replies=iter([reply("ai-1", "Hello, Ada.", output_tokens=3), reply("ai-2", "Bye, Ada.", output_tokens=2)]), seen=[])
    graph = chat_graph(model, InMemorySaver(), wrap=True)
    state = await run_exchanges(pipeline, thread, graph, ["hi, I am Ada", "bye"])
    assert {m.id for m in state.values["messages"] if m.type == "ai"}.isdisjoint({"ai-1", "ai-2"})  # really wrapped
    assert stored_conversation(pipeline, key) == held(state.values["messages"]) == [
        ("user", "hi, I am Ada"), ("assistant", "Hello, Ada."), ("user", "bye"), ("assistant", "Bye, Ada."),
    ]
    assert [t[5] for t in turns(pipeline, key)] == [0, 3, 0, 2]


async def test_a_routers_model_call_is_not_a_turn_by_default(pipeline):
    """A classifier node streams its model's answer and writes nothing: not part of the conversation."""
    thread = f"lg-router-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, thread)
    model = ScriptedChat(replies=iter([
        reply("route-1", "billing"), reply("ai-1", "Your invoice is attached.", output_tokens=5),
        reply("route-2", "smalltalk"), reply("ai-2", "You are welcome.", output_tokens=3),
    ]), seen=[])
    graph = chat_graph(model, InMemorySaver(), router=True)
    state = await run_exchanges(pipeline, thread, graph, ["My invoice?", "Thanks"])
    assert len(model.seen) == 4  # the router's model was called, and streamed
    assert stored_conversation(pipeline, key) == held(state.values["messages"]) == [
        ("user", "My invoice?"), ("assistant", "Your invoice is attached."), ("user", "Thanks"), ("assistant", "You are welcome."),
    ]


async def test_partial_nodes_keep_a_routers_text_out_of_the_partials(pipeline):
    thread = f"lg-partial-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, thread)
    model = ScriptedChat(replies=iter([reply("route-1", "billing"), reply("ai-1", "Your invoice is attached.", output_tokens=5)]), seen=[])
    graph = chat_graph(model, InMemorySaver(), router=True)
    async with recorder_for(pipeline.settings) as recorder:
        mirror = await LangGraphMirror.open(recorder, thread, fleet=FLEET, agent_id="bot", partial_nodes=["chat"])
        async for mode, chunk in mirror.astream(graph, {"messages": [("user", "My invoice?")]}, config(thread)):
            if mode == "updates" and "router" in chunk:
                assert mirror.recorded.open_turns == ()  # the router's streamed text opened no turn
        await mirror.end("completed")
    await asyncio.to_thread(wait_until, lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{thread} finalized")
    state = await graph.aget_state(config(thread))
    assert stored_conversation(pipeline, key) == held(state.values["messages"])


async def test_a_preamble_with_tool_calls_keeps_its_tools_results(pipeline):
    """"Let me check" with a tool call is a turn; its call's result comes with the tools node's ToolMessage."""
    thread = f"lg-preamble-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, thread)
    call = {"name": "order_status", "args": {"order": "42"}, "id": "call-1", "type": "tool_call"}
    model = ScriptedChat(replies=iter([
        reply("ai-1", "Let me check.", tool_calls=[call], input_tokens=11, output_tokens=3),
        reply("ai-2", "It ships tomorrow.", input_tokens=25, output_tokens=4),
    ]), seen=[])
    graph = chat_graph(model, InMemorySaver())
    state = await run_exchanges(pipeline, thread, graph, ["Where is order 42?"])
    messages = state.values["messages"]
    assert stored_conversation(pipeline, key) == held(messages) == [
        ("user", "Where is order 42?"), ("assistant", "Let me check."), ("assistant", "It ships tomorrow."),
    ]
    (tool_message,) = [m for m in messages if m.type == "tool"]
    recorded_call = {"name": "order_status", "arguments": {"order": "42"}, "result": tool_message.content}
    assert [(t[4], t[5], t[7]) for t in turns(pipeline, key)] == [(0, 0, None), (11, 3, [recorded_call]), (25, 4, None)]


async def test_a_resume_whose_first_stream_failed_rebuilds_the_thread_on_the_next(pipeline):
    """The first astream after a resume fails before the graph saved anything (the checkpointer
    was unreachable): the next one still puts turnlog's history in front of the input."""
    thread = f"lg-retry-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, thread)
    first = ScriptedChat(replies=iter([reply("ai-1", "Hello, Ada.", output_tokens=3)]), seen=[])
    async with recorder_for(pipeline.settings) as recorder:
        mirror = await LangGraphMirror.open(recorder, thread, fleet=FLEET, agent_id="bot")
        async for _ in mirror.astream(chat_graph(first, InMemorySaver()), {"messages": [("user", "I am Ada")]}, config(thread)):
            pass
    model = ScriptedChat(replies=iter([reply("ai-2", "You are Ada.", input_tokens=8, output_tokens=3)]), seen=[])
    saver = UnreachableOnce()
    graph = chat_graph(model, saver)
    async with recorder_for(pipeline.settings) as recorder:
        mirror = await LangGraphMirror.open(recorder, thread, fleet=FLEET, agent_id="bot")
        with pytest.raises(ConnectionError):
            async for _ in mirror.astream(graph, {"messages": [("user", "Who am I?")]}, config(thread)):
                pass
        assert saver.failed and model.seen == []
        async for _ in mirror.astream(graph, {"messages": [("user", "Who am I?")]}, config(thread)):
            pass
        await mirror.end("completed")
    assert held(model.seen[0]) == [("user", "I am Ada"), ("assistant", "Hello, Ada."), ("user", "Who am I?")]
    await asyncio.to_thread(wait_until, lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{thread} finalized")
    state = await graph.aget_state(config(thread))
    assert stored_conversation(pipeline, key) == held(state.values["messages"]) == [
        ("user", "I am Ada"), ("assistant", "Hello, Ada."), ("user", "Who am I?"), ("assistant", "You are Ada."),
    ]


class UnreachableOnce(InMemorySaver):
    """An in-memory checkpointer whose first read fails as an unreachable database's would."""

    failed = False

    async def aget_tuple(self, config):
        if not self.failed:
            self.failed = True
            raise ConnectionError("checkpointer unreachable")
        return await super().aget_tuple(config)


async def stream(mirror, graph, input, thread):
    """Run one ``mirror.astream`` to its end; the ``__interrupt__`` updates it yielded."""
    interrupts = []
    async for mode, chunk in mirror.astream(graph, input, config(thread)):
        if mode == "updates" and "__interrupt__" in chunk:
            interrupts.append(chunk["__interrupt__"])
    return interrupts


async def test_a_reviewed_answer_is_stored_as_the_reviewer_edited_or_approved_it(pipeline):
    """interrupt() with the draft, then an AIMessage with the draft's id (add_messages replaces
    the draft): turnlog stores the text the state holds, the edit, not the unapproved draft;
    a draft approved as it is (no write) is stored as drafted."""
    thread = f"lg-review-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, thread)
    model = ScriptedChat(replies=iter([
        reply("ai-1", "Refund of 40 EUR approved, no questions asked.", input_tokens=9, output_tokens=8),
        reply("ai-2", "Your parcel left the warehouse.", input_tokens=20, output_tokens=5),
    ]), seen=[])
    graph = review_graph(model, InMemorySaver())
    async with recorder_for(pipeline.settings) as recorder:
        mirror = await LangGraphMirror.open(recorder, thread, fleet=FLEET, agent_id="bot")
        assert await stream(mirror, graph, {"messages": [("user", "I want a refund")]}, thread)  # the review waits
        assert (await graph.aget_state(config(thread))).next == ("review",)
        assert not await stream(mirror, graph, Command(resume="Your refund of 40 EUR is on its way."), thread)
        assert await stream(mirror, graph, {"messages": [("user", "Where is my parcel?")]}, thread)
        assert not await stream(mirror, graph, Command(resume={"approved": True}), thread)  # approved as drafted
        await mirror.end("completed")
    await asyncio.to_thread(wait_until, lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{thread} finalized")
    state = await graph.aget_state(config(thread))
    assert stored_conversation(pipeline, key) == held(state.values["messages"]) == [
        ("user", "I want a refund"), ("assistant", "Your refund of 40 EUR is on its way."),
        ("user", "Where is my parcel?"), ("assistant", "Your parcel left the warehouse."),
    ]
    assert [(t[4], t[5]) for t in turns(pipeline, key)] == [(0, 0), (9, 8), (0, 0), (20, 5)]


async def test_the_humans_words_given_with_command_resume_are_stored_as_a_user_turn(pipeline):
    """Command(resume=..., update={"messages": [HumanMessage(...)]}): the update puts the
    human's reply in the state before the interrupted node resumes; turnlog stores it in
    the state's order."""
    thread = f"lg-clarify-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, thread)
    model = ScriptedChat(replies=iter([
        reply("ai-1", "Which order do you mean?", input_tokens=7, output_tokens=5),
        reply("ai-2", "Order 42 is cancelled.", input_tokens=16, output_tokens=5),
    ]), seen=[])
    graph = clarify_graph(model, InMemorySaver())
    async with recorder_for(pipeline.settings) as recorder:
        mirror = await LangGraphMirror.open(recorder, thread, fleet=FLEET, agent_id="bot")
        assert await stream(mirror, graph, {"messages": [("user", "Cancel my order")]}, thread)
        answer = Command(resume="answered", update={"messages": [HumanMessage("Order 42, the blue one")]})
        assert not await stream(mirror, graph, answer, thread)
        await mirror.end("completed")
    assert held(model.seen[1])[-1] == ("user", "Order 42, the blue one")  # the model was given it
    await asyncio.to_thread(wait_until, lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{thread} finalized")
    state = await graph.aget_state(config(thread))
    assert stored_conversation(pipeline, key) == held(state.values["messages"]) == [
        ("user", "Cancel my order"), ("assistant", "Which order do you mean?"),
        ("user", "Order 42, the blue one"), ("assistant", "Order 42 is cancelled."),
    ]


def attributes(pipeline, key):
    """The attributes (``kind``, ...) of the stored turns of the session keyed ``key``, in turn order."""
    from sqlalchemy import select

    from turnlog.sinks.tables import transcript_turns

    t = transcript_turns.c
    with pipeline.store.engine.connect() as conn:
        return [row[0] for row in conn.execute(
            select(t.attributes).where(t.session_id == key).order_by(t.turn_index))]


def summarizing_agent(model, summarizer, checkpointer):
    """LangChain's ``create_agent`` with its ``SummarizationMiddleware``: before each model call
    on 5 messages or more (from the third question on), the middleware has ``summarizer``
    summarize all but the last 2 and writes the summary as a ``HumanMessage`` in their place
    (``RemoveMessage(REMOVE_ALL_MESSAGES)`` first)."""
    import langgraph.version
    from packaging.version import Version

    if Version(langgraph.version.__version__) < Version("1.0"):
        pytest.skip(f"create_agent is LangChain 1.x, which needs langgraph 1.x (this is {langgraph.version.__version__})")
    pytest.importorskip("langchain.agents.middleware", reason="langchain (the adapter-tests extra) is not installed")
    from langchain.agents import create_agent
    from langchain.agents.middleware import SummarizationMiddleware

    middleware = SummarizationMiddleware(model=summarizer, trigger=("messages", 5), keep=("messages", 2))
    return create_agent(model=model, tools=[], middleware=[middleware], checkpointer=checkpointer)


async def test_a_summarization_middlewares_summary_is_stored_as_a_summary_and_a_resume_still_compares(pipeline):
    """create_agent + SummarizationMiddleware: the summary it writes is a turn of kind summary,
    not something the user said, also when a resumed mirror finds it in the checkpointer; the
    resume's comparison still finds what the checkpointer saved past turnlog."""
    thread = f"lg-summary-{uuid.uuid4().hex[:8]}"
    key = session_key(FLEET, thread)
    model = ScriptedChat(replies=iter([reply(f"ai-{n}", f"answer {n}", output_tokens=2) for n in range(5)]), seen=[])
    summarizer = ScriptedChat(replies=iter([reply(f"sum-{n}", f"Ada asked {n + 3} questions.") for n in range(3)]), seen=[])
    checkpointer = InMemorySaver()  # outlives the first "process"
    graph = summarizing_agent(model, summarizer, checkpointer)
    async with recorder_for(pipeline.settings) as recorder:
        mirror = await LangGraphMirror.open(recorder, thread, fleet=FLEET, agent_id="bot")
        for n in range(3):
            async for _ in mirror.astream(graph, {"messages": [("user", f"question {n}")]}, config(thread)):
                pass
        async for _ in graph.astream({"messages": [("user", "question 3")]}, config(thread)):
            pass  # not mirrored: as if killed after the checkpointer saved it
    async with recorder_for(pipeline.settings) as recorder:
        mirror = await LangGraphMirror.open(recorder, thread, fleet=FLEET, agent_id="bot")
        assert [m.content for m in mirror.history] == [  # no summary in what a lost thread is rebuilt from
            "question 0", "answer 0", "question 1", "answer 1", "question 2", "answer 2"]
        async for _ in mirror.astream(graph, {"messages": [("user", "question 4")]}, config(thread)):
            pass
        await mirror.end("completed")
    summaries = [m for m in model.seen[-1] if m.additional_kwargs.get("lc_source") == "summarization"]
    assert [m.type for m in summaries] == ["human"]  # the model was given the middleware's summary
    await asyncio.to_thread(wait_until, lambda: finalized(pipeline, key), timeout=TIMEOUT, what=f"{thread} finalized")
    stored = [(speaker, text, (attrs or {}).get("kind")) for (_, speaker, text, *_), attrs
              in zip(turns(pipeline, key), attributes(pipeline, key), strict=True)]
    def summary(n):
        return ("user", f"Here is a summary of the conversation to date:\n\nAda asked {n} questions.", "summary")

    assert stored == [
        ("user", "question 0", None), ("assistant", "answer 0", None),
        ("user", "question 1", None), ("assistant", "answer 1", None),
        ("user", "question 2", None), summary(3), ("assistant", "answer 2", None),
        ("user", "question 3", None), summary(4), ("assistant", "answer 3", None),  # from the checkpointer
        ("user", "question 4", None), summary(5), ("assistant", "answer 4", None),
    ]
    assert [t[3] for t in turns(pipeline, key)] == ["complete"] * 13
    state = await graph.aget_state(config(thread))
    context = [(speaker, text) for speaker, text, kind in stored if kind is None]
    kept = [pair for pair in held(state.values["messages"]) if not pair[1].startswith("Here is a summary")]
    assert context[-len(kept):] == kept  # what the state keeps of the conversation is turnlog's last turns

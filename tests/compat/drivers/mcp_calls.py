"""The MCP Python SDK's client (as vLLM, open-instruct and verifiers use it) calling rl-sandbox's
tools over streamable HTTP and over stdio (`rl-sandbox mcp`). Env: MCP_URL, MCP_KEY, MCP_COMMAND
(the rl-sandbox executable), MCP_SERVICE. Prints one JSON object of what came back."""

import asyncio
import base64
import json
import os

from mcp import ClientSession, StdioServerParameters
from mcp.client.sse import sse_client
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamablehttp_client

PLOT = "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"


def texts(result):
    return "".join(block.text for block in result.content if block.type == "text")


async def calls(session, seen, prefix):
    await session.initialize()
    seen[prefix + "tools"] = sorted(tool.name for tool in (await session.list_tools()).tools)
    await session.call_tool("python", {"code": "x = 41"})
    seen[prefix + "stateful"] = texts(await session.call_tool("python", {"code": "x + 1"}))
    stateless = await session.call_tool("python_stateless", {"code": "print(x)"})
    seen[prefix + "stateless_error"] = stateless.isError
    seen[prefix + "stateless_text"] = texts(stateless)
    plot = await session.call_tool("python", {"code": PLOT})
    images = [block for block in plot.content if block.type == "image"]
    seen[prefix + "image_types"] = [block.mimeType for block in images]
    seen[prefix + "image_magic"] = [base64.b64decode(block.data)[:8].hex() for block in images]
    error = await session.call_tool("python", {"code": "1/0"})
    seen[prefix + "error"] = [error.isError, texts(error)]


def http(headers):
    return streamablehttp_client(os.environ["MCP_URL"], headers=headers)


async def main():
    seen = {}
    key = {"Authorization": "Bearer " + os.environ["MCP_KEY"]}
    async with http(key) as (read, write, _), ClientSession(read, write) as session:
        await calls(session, seen, "http_")
    async with http(key) as (read, write, _), ClientSession(read, write) as session:
        await session.initialize()
        other = await session.call_tool("python", {"code": "x"})
        seen["new_session_lacks_x"] = "NameError" in texts(other)
    sse_url = os.environ["MCP_URL"] + "/sse"
    async with sse_client(sse_url, headers=key) as (read, write), ClientSession(read, write) as s:
        await calls(s, seen, "sse_")
    async with sse_client(sse_url, headers=key) as (read, write), ClientSession(read, write) as s:
        init = await s.initialize()
        seen["server_name"] = init.serverInfo.name
        seen["sse_new_session_lacks_x"] = "NameError" in texts(
            await s.call_tool("python", {"code": "x"})
        )
    try:
        async with http({}) as (read, write, _), ClientSession(read, write) as session:
            await session.initialize()
        seen["no_key"] = "accepted"
    except BaseException as exc:
        seen["no_key"] = repr(exc)[:300]
    server = StdioServerParameters(
        command=os.environ["MCP_COMMAND"],
        args=["mcp", "--url", os.environ["MCP_SERVICE"]],
        env={"RL_SANDBOX_API_KEY": os.environ["MCP_KEY"], "PATH": os.environ.get("PATH", "")},
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await calls(session, seen, "stdio_")
    print(json.dumps(seen))


asyncio.run(main())

"""HTTP both ways: the server the proxy's clients talk to (server.py on uvicorn, request.py) and the client it
talks to its workers with (client.py, response.py)."""

"""hybrid-pd KV connector for vLLM (see DESIGN.md). Importing this package must stay light: no vLLM."""

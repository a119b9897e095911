"""The one generation pipeline every surface calls: a body validated and
tokenized (`prompts`, `validation`), admitted and charged, its grammar compiled,
submitted to the engine with one consumer per choice (`request_run`), and shaped
into a whole response or a stream (`generation`, `shapes`).

A surface (`openai_chat`, `responses`, `anthropic`, ...) parses its own wire format
into a validated request, calls `generation`, and shapes the choices it gets back;
it never reimplements admission, cancellation or deadlines."""

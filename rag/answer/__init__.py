"""The answer: a question in, a cited answer out, or a plain "the notes do not say".

``service.AnswerService`` runs the steps: rewrite the question, search the index
(``rag.index.retrieve``), expand a paraphrase with the LLM (``expand``), rerank
(``rerank``), refuse a name no note mentions (``confidence``), build the evidence and
the prompt (``evidence``), ask the LLM (``rag.llm``, sized by ``rag.speed``), and read
its reply for citations (``grounding``). ``feedback`` keeps the answers the bots sent and
what the askers thought of them.

Imports the index, the memory (entities and facts for the evidence) and the plumbing.
"""

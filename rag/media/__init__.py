"""Voice messages and photos, read on this machine: what a person sends a chat bot that is
not text. A clip becomes its words (``speech``: Whisper base in CTranslate2 form, through
``faster-whisper``), an image its text (``ocr``: PP-OCRv4 through ``rapidocr-onnxruntime``);
both come from optional extras (``leanote-rag[speech]``, ``leanote-rag[ocr]``) and fetch nothing
at run time. ``base`` holds what they give back and the errors a person is told, ``audio`` the
decoding of a clip, ``queue`` the one line every such job on the machine waits in (one at a
time, people taking turns), and ``media`` the part the composition root builds once."""

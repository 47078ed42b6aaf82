"""A tiny EmbeddingGemma stand-in for the tests: the real architecture (a Gemma 3 text model,
bidirectional, mean pooling, two dense layers, normalised) and the real prompts, in a
sentence-transformers folder of a few hundred kilobytes, with random weights and a tokenizer of
one token per character. Built with the libraries the gemma extra installs; what it embeds means
nothing, how it is embedded is the real path."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

QUERY_PROMPT = "task: search result | query: "
DOCUMENT_PROMPT = "title: none | text: "
_CHARS = ("的是了我不在人有这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可里后小么心多天而能好都然"
          "没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长知民样现分将外但身些与高意进把法此"
          "实回二理美点月明其种声全工己话儿者向情部正名定女问力机给等几很业最间新什打便位因重被走电四第门相次东政海口使教西再"
          "平真听世气信北少关并内加化由却代军产入先山五太水万市眼体别处总才场师书比住员九笑性通目华报立马命张活难神数件安表原"
          "车白应路期叫死常提感金何更反合放做系计或司利受光王果亲界及今京务制解各任至清物台象记边共风战干接它许八特觉望直服毛"
          "林题建南度统色字请交爱让认算论百吃义科怎元社术结六功指思非流每青管夫连远资队跟带花快条院变联言权往展该领传近留红治"
          "决周保达办运武半候七必城父强步完革深区即求品士转量空甚众技轻程告江语英基派满式李息写呢识极令黄德收脸钱党倒未持取设"
          "始版双历越史商千片容研像找友孩站广改议形委早房音火际则首单据导影失拿网香似斯专石若兵弟谁校读志飞观争究包组造落视济"
          "喜离虽坏兴嘛炒蛋番茄肉炖锅油盐糖醋酱葱姜蒜鸡鸭鱼虾汤饭面粥菜煮蒸烤煎炸")


def tiny_gemma(folder: Path) -> Path:
    """The stand-in model's folder (made once: a folder already there is kept)."""
    if (folder / "modules.json").exists():
        return folder
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers import models as st
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import Gemma3TextConfig, Gemma3TextModel, PreTrainedTokenizerFast

    torch.manual_seed(0)
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    for ch in [chr(c) for c in range(32, 127)] + list(_CHARS):
        vocab.setdefault(ch, len(vocab))
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>", pad_token="<pad>")
    config = Gemma3TextConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=1024,
                              sliding_window=64, layer_types=["sliding_attention", "full_attention"],
                              use_bidirectional_attention=True, pad_token_id=0, bos_token_id=2, eos_token_id=1)
    work = Path(tempfile.mkdtemp(prefix="tiny-gemma-"))
    try:
        Gemma3TextModel(config).save_pretrained(work / "hf")
        fast.save_pretrained(work / "hf")
        identity = torch.nn.Identity()
        modules = [st.Transformer(str(work / "hf"), max_seq_length=1024), st.Pooling(32, pooling_mode="mean"),
                   st.Dense(32, 96, bias=False, activation_function=identity),
                   st.Dense(96, 768, bias=False, activation_function=identity), st.Normalize()]
        model = SentenceTransformer(modules=modules, prompts={"query": QUERY_PROMPT, "document": DOCUMENT_PROMPT})
        model.save(str(folder))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder

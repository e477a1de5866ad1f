"""What tells CosyVoice2 and CosyVoice3 apart: their text specials and the layout of their speech-token tables.

Both put a Qwen2 LLM (``CosyVoice-BlankEN``) between a text tokenizer and 6,561 speech tokens (25 per second). The
LLM reads ``[sos] text [task_id] prompt-speech`` and answers speech tokens from a head of its own until a stop token.

- CosyVoice2 adds 19 specials to the Qwen2 tokenizer. Its speech table has 6,564 rows (the tokens, then three end
  tokens), its head a bias; sos and task_id are the two rows of a table of their own.
- CosyVoice3 adds 280 specials (CosyVoice2's, ``<|endofsystem|>``, ARPAbet phones, pinyin initials and finals). Its
  speech table has 6,761 rows: the tokens, then sos, an end token, task_id and a fill token; every row after the
  tokens stops generation. Its head has no bias.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GenerationName = Literal["cosyvoice2", "cosyvoice3"]

#: Speech tokens proper (the speech tokenizer's FSQ codes, 3^8), in both generations.
SPEECH_TOKENS = 6561
#: The speech tokenizer's file in each generation's official checkpoint.
SPEECH_TOKENIZER_FILES: dict[GenerationName, str] = {
    "cosyvoice2": "speech_tokenizer_v2.onnx",
    "cosyvoice3": "speech_tokenizer_v3.onnx",
}

_V2_SPECIALS = (
    "<|im_start|> <|im_end|> <|endofprompt|> [breath] <strong> </strong> [noise] [laughter] [cough] [clucking] "
    "[accent] [quick_breath] <laughter> </laughter> [hissing] [sigh] [vocalized-noise] [lipsmack] [mn]"
).split()
_ARPABET = (
    "AA AA0 AA1 AA2 AE AE0 AE1 AE2 AH AH0 AH1 AH2 AO AO0 AO1 AO2 AW AW0 AW1 AW2 AY AY0 AY1 AY2 B CH D DH EH EH0 EH1 "
    "EH2 ER ER0 ER1 ER2 EY EY0 EY1 EY2 F G HH IH IH0 IH1 IH2 IY IY0 IY1 IY2 JH K L M N NG OW OW0 OW1 OW2 OY OY0 OY1 "
    "OY2 P R S SH T TH UH UH0 UH1 UH2 UW UW0 UW1 UW2 V W Y Z ZH"
).split()
_PINYIN = (
    "a ai an ang ao b c ch d e ei en eng f g h i ian in ing iu ià iàn iàng iào iá ián iáng iáo iè ié iòng ióng iù "
    "iú iā iān iāng iāo iē iě iōng iū iǎ iǎn iǎng iǎo iǒng iǔ j k l m n o ong ou p q r s sh t u uang ue un uo uà "
    "uài uàn uàng uá uái uán uáng uè ué uì uí uò uó uā uāi uān uāng uē uě uī uō uǎ uǎi uǎn uǎng uǐ uǒ vè w x y z zh "
    "à ài àn àng ào á ái án áng áo è èi èn èng èr é éi én éng ér ì ìn ìng í ín íng ò òng òu ó óng óu ù ùn ú ún ā āi "
    "ān āng āo ē ēi ēn ēng ě ěi ěn ěng ěr ī īn īng ō ōng ōu ū ūn ǎ ǎi ǎn ǎng ǎo ǐ ǐn ǐng ǒ ǒng ǒu ǔ ǔn ǘ ǚ ǜ"
).split()


@dataclass(frozen=True)
class Generation:
    """One CosyVoice generation's LLM layout (indices are rows of its speech table)."""

    name: GenerationName
    #: Special tokens added to the Qwen2 tokenizer, in order (the ones it already has keep their ids).
    text_specials: tuple[str, ...]
    #: Rows of the speech table (and outputs of the LLM's head): the speech tokens, then the generation's extras.
    speech_rows: int
    #: Names of the speech table's rows in the converted tokenizer where they are not ``<|s_N|>``.
    row_names: dict[int, str]
    #: The speech-table rows whose generation ends the answer (the end token among them first).
    stop_rows: tuple[int, ...]
    #: Where the vectors of sos and task_id are: rows of the speech table, or None (a table of their own).
    sos_row: int | None
    task_row: int | None

    @property
    def end_row(self) -> int:
        return self.stop_rows[0]

    def token_names(self) -> list[str]:
        """The converted tokenizer's names of the speech table's rows, in order."""
        return [self.row_names.get(row, f"<|s_{row}|>") for row in range(self.speech_rows)]


COSYVOICE2 = Generation(
    name="cosyvoice2",
    text_specials=tuple(_V2_SPECIALS),
    speech_rows=SPEECH_TOKENS + 3,
    row_names={SPEECH_TOKENS: "<|eos1|>", SPEECH_TOKENS + 1: "<|eos2|>", SPEECH_TOKENS + 2: "<|eos3|>"},
    stop_rows=(SPEECH_TOKENS, SPEECH_TOKENS + 1, SPEECH_TOKENS + 2),
    sos_row=None,
    task_row=None,
)
COSYVOICE3 = Generation(
    name="cosyvoice3",
    text_specials=(*_V2_SPECIALS, "<|endofsystem|>", *(f"[{name}]" for name in (*_ARPABET, *_PINYIN))),
    speech_rows=SPEECH_TOKENS + 200,
    row_names={
        SPEECH_TOKENS: "<|sos|>",
        SPEECH_TOKENS + 1: "<|eos1|>",
        SPEECH_TOKENS + 2: "<|task_id|>",
        SPEECH_TOKENS + 3: "<|fill|>",
    },
    # the end token first; sos, task_id, fill and the 196 unused rows end an answer too
    stop_rows=(SPEECH_TOKENS + 1, SPEECH_TOKENS, *range(SPEECH_TOKENS + 2, SPEECH_TOKENS + 200)),
    sos_row=SPEECH_TOKENS,
    task_row=SPEECH_TOKENS + 2,
)
GENERATIONS = {generation.name: generation for generation in (COSYVOICE2, COSYVOICE3)}
#: Names CosyVoice2's converted tokenizer gives sos and task_id, whose vectors come from their own table.
SOS, TASK_ID = "<|sos|>", "<|task_id|>"

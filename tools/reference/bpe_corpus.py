"""A small multilingual training corpus for the fixture tokenizers (written for k3).
English prose, code, Chinese, Japanese, Russian, Greek, emoji, numbers and whitespace runs,
so the trained merges cover every branch of the Kimi pre-tokenizer (kimi_pat.py)."""

CORPUS = r"""
The morning train left the valley station at seven, climbing slowly through the pine forest.
Every passenger had a story: a teacher going home for the holidays, two students carrying
heavy books about mathematics, and an old man who knew the name of every river we crossed.
We don't always notice how the light changes in the mountains, but that day it was impossible
to ignore. The clouds were low, the air was cold, and the small windows were covered in frost.
When the train stopped at the village, the children ran to the platform to watch it leave again.
She said she'd remember the sound of the wheels for the rest of her life. They're still there,
the old tracks, although the line was closed many years ago. I've walked along them twice.
In the evening we cooked soup with potatoes, onions, carrots and a little butter. The recipe is
simple: cut the vegetables, boil the water, add salt, and wait for about forty minutes.
Reading, writing and counting are the first things a school teaches; patience comes later.
The library opens at 9:30 and closes at 18:00 on weekdays (it is closed on Sundays).
A good engineer measures twice and cuts once. A good reference implementation is slow,
plain and obviously correct; a good engine is fast and agrees with the reference.
Numbers: 0, 1, 2, 3, 42, 100, 256, 1024, 65536, 3.14159, 2.71828, 1e-5, 2026-08-07, 12:45:00.
Prices: $19.99, EUR 45.50, 1,000,000 units, 15% off, item #4096, version v1.2.3.

fn main() {
    let values: Vec<f32> = (0..16).map(|i| i as f32 * 0.5).collect();
    let total: f32 = values.iter().sum();
    println!("total = {}", total);
    for (index, value) in values.iter().enumerate() {
        if *value > 3.0 {
            println!("value[{}] = {:.2}", index, value);
        }
    }
}

pub struct Matrix {
    rows: usize,
    cols: usize,
    data: Vec<f32>,
}

impl Matrix {
    pub fn new(rows: usize, cols: usize) -> Self {
        Self { rows, cols, data: vec![0.0; rows * cols] }
    }
    pub fn get(&self, r: usize, c: usize) -> f32 {
        self.data[r * self.cols + c]
    }
}

def softmax(values):
    largest = max(values)
    exps = [math.exp(v - largest) for v in values]
    total = sum(exps)
    return [e / total for e in exps]

class Tokenizer:
    def __init__(self, ranks, pattern):
        self.ranks = ranks
        self.pattern = pattern

    def encode(self, text):
        result = []
        for piece in self.pattern.findall(text):
            result.extend(self.bpe(piece.encode("utf-8")))
        return result

for i in range(10):
    if i % 2 == 0:
        print(f"even {i}")
    else:
        print(f"odd {i}")

SELECT name, count(*) FROM users WHERE age >= 18 GROUP BY name ORDER BY count(*) DESC;
<div class="header"><a href="/index.html">Home</a> | <a href="/about.html">About</a></div>
{"name": "tiny", "layers": 13, "experts": [0, 1, 2, 3], "enabled": true, "ratio": 0.25}

今天天气很好，我们去公园散步吧。山上的空气非常新鲜，河水也很清澈。
我喜欢读书，也喜欢写字。学习语言需要时间和耐心，每天练习一点点就会进步。
这个模型有很多层，每一层都有注意力和专家网络。中文English混合的句子也很常见。
火车在早上七点离开车站，穿过森林和山谷，晚上到达海边的小城。
北京、上海、广州和深圳都是很大的城市。人工智能正在改变我们的生活和工作。
今日はとても良い天気です。私たちは駅の近くの小さな店でお茶を飲みました。
日本語の文章にはひらがなとカタカナと漢字が混ざっています。ありがとうございます。
Сегодня хорошая погода, и мы пошли гулять в парк. Поезд ушёл рано утром.
Москва и Санкт-Петербург — большие города. Я люблю читать книги и писать письма.
Привет, мир! Как дела? Всё хорошо, спасибо. Мы учимся программировать на языке Rust.
Καλημέρα κόσμε. Η θάλασσα είναι ήσυχη σήμερα και ο ουρανός είναι καθαρός.
Ça va très bien, merci! Où est la gare? L'été dernier, nous sommes allés à la mer.
Über den Bergen liegt der Schnee. Grüße aus München und schöne Feiertage!
¿Dónde está la biblioteca? Mañana vamos a la playa con nuestros amigos.
Emoji: 😀 😃 😄 🚀 🌍 🌧️ ☕ 🍜 👍🏽 👨‍👩‍👧 ❤️ ✨ 🎉 🐍 🦀 — great job! 🚀🚀🚀
The rocket 🚀 launched at dawn; the crowd cheered 🎉 and the dog barked 🐕.
Tabs	and	spaces    are    different; trailing spaces here   
and blank lines follow.


THE END OF THE FIRST PART. The second part repeats some words so merges become longer:
the the the and and and of of of to to to in in in is is is that that that it it it
training training training tokenizer tokenizer tokenizer language language language
model model model layer layer layer expert expert expert attention attention attention
residual residual residual reference reference reference fixture fixture fixture
"""
